//! [`HttpRetryLayer`]: the HTTP front-end of the retry engine. Around a
//! [`BackoffRetry`] with the [`HttpPolicy`], it does what only an HTTP front-end
//! can: reads a caller's per-request [`RetryLimits`] from the request's
//! extensions, and tells the caller what the retries cost in a
//! [`RetryInfo`] in the response's extensions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::http::{Extensions, Request, Response};
use pin_project_lite::pin_project;
use tower_backoff_core::deadline::{AttemptTimer, NoTimeout};
use tower_backoff_core::future::ResponseFuture;
use tower_backoff_core::policy::{Policy, RetryLimits};
use tower_backoff_core::{BackoffLayer, BackoffRetry};
use tower_layer::Layer;
use tower_service::Service;

use super::info::RetryInfo;
use super::policy::HttpPolicy;

const DEFAULTS: &str = "the default settings are valid";

/// Retries HTTP requests with the [`HttpPolicy`] and the default budget,
/// honours a [`RetryLimits`] in a request's extensions, and puts a
/// [`RetryInfo`] in the extensions of every response it returns.
///
/// It works around any `Service<http::Request<B>>` (hyper-util's `Client`)
/// and, with the `reqwest` feature, around `reqwest::Client`
/// (`Service<reqwest::Request>`, whose extensions are private: there only
/// the `RetryInfo` applies).
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::http::{HttpPolicy, HttpRetryLayer};
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// // The defaults:
/// let layer = HttpRetryLayer::new();
/// # drop(layer);
/// // Or any retry layer with the HTTP policy:
/// let layer = HttpRetryLayer::from(
///     BackoffLayer::builder()
///         .policy(HttpPolicy::new())
///         .schedule(Exponential::new(Duration::from_millis(100)))
///         .build()?,
/// );
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
pub struct HttpRetryLayer<T = NoTimeout> {
    layer: BackoffLayer<HttpPolicy, T>,
    record_info: bool,
}

impl HttpRetryLayer {
    /// The HTTP policy's defaults with the layer's: 3 attempts, exponential
    /// backoff with full jitter, the default budget.
    pub fn new() -> Self {
        Self::from(
            BackoffLayer::builder()
                .policy(HttpPolicy::new())
                .build()
                .expect(DEFAULTS),
        )
    }
}

impl Default for HttpRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> HttpRetryLayer<T> {
    /// Stops adding [`RetryInfo`] to responses. `http::Extensions` boxes
    /// every value, so recording it costs one small allocation per request.
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// The retry layer it wraps.
    pub fn backoff(&self) -> &BackoffLayer<HttpPolicy, T> {
        &self.layer
    }
}

impl<T> From<BackoffLayer<HttpPolicy, T>> for HttpRetryLayer<T> {
    fn from(layer: BackoffLayer<HttpPolicy, T>) -> Self {
        Self {
            layer,
            record_info: true,
        }
    }
}

impl<T> Clone for HttpRetryLayer<T> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            record_info: self.record_info,
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for HttpRetryLayer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRetryLayer")
            .field("layer", &self.layer)
            .field("record_info", &self.record_info)
            .finish()
    }
}

impl<S, T> Layer<S> for HttpRetryLayer<T> {
    type Service = HttpRetry<S, T>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpRetry {
            inner: self.layer.layer(inner),
            record_info: self.record_info,
        }
    }
}

/// The service of an [`HttpRetryLayer`]: a [`BackoffRetry`] with the
/// [`HttpPolicy`] that reads per-request limits and records [`RetryInfo`].
pub struct HttpRetry<S, T = NoTimeout> {
    inner: BackoffRetry<S, HttpPolicy, T>,
    record_info: bool,
}

impl<S, T> HttpRetry<S, T> {
    /// The retrying service it wraps.
    pub fn get_ref(&self) -> &BackoffRetry<S, HttpPolicy, T> {
        &self.inner
    }

    /// Unwraps the retrying service.
    pub fn into_inner(self) -> BackoffRetry<S, HttpPolicy, T> {
        self.inner
    }
}

impl<S: Clone, T> Clone for HttpRetry<S, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            record_info: self.record_info,
        }
    }
}

impl<S: fmt::Debug, T: fmt::Debug> fmt::Debug for HttpRetry<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRetry")
            .field("inner", &self.inner)
            .field("record_info", &self.record_info)
            .finish()
    }
}

impl<S, T, B> Service<Request<B>> for HttpRetry<S, T>
where
    S: Service<Request<B>> + Clone,
    S::Response: ResponseExtensions,
    T: AttemptTimer<S::Error>,
    HttpPolicy: Policy<Request<B>, S::Response, T::Error>,
{
    type Response = S::Response;
    type Error = T::Error;
    type Future = HttpResponseFuture<S, Request<B>, T>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limits = request.extensions().get::<RetryLimits>().copied();
        let inner = match limits {
            Some(limits) => self.inner.call_with_limits(request, limits),
            None => self.inner.call(request),
        };
        HttpResponseFuture::new(inner, self.record_info)
    }
}

#[cfg(feature = "reqwest")]
impl<S, T> Service<reqwest::Request> for HttpRetry<S, T>
where
    S: Service<reqwest::Request> + Clone,
    S::Response: ResponseExtensions,
    T: AttemptTimer<S::Error>,
    HttpPolicy: Policy<reqwest::Request, S::Response, T::Error>,
{
    type Response = S::Response;
    type Error = T::Error;
    type Future = HttpResponseFuture<S, reqwest::Request, T>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        HttpResponseFuture::new(self.inner.call(request), self.record_info)
    }
}

pin_project! {
    /// The response future of an [`HttpRetry`] (and of the gRPC layer): the
    /// retry engine's future, whose response gets a [`RetryInfo`].
    pub struct HttpResponseFuture<S, Req, T = NoTimeout, P = HttpPolicy>
    where
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
    {
        #[pin]
        inner: ResponseFuture<S, P, Req, T>,
        record_info: bool,
    }
}

impl<S, Req, T, P> HttpResponseFuture<S, Req, T, P>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    /// Records a [`RetryInfo`] on the response of `inner` if `record_info`.
    pub fn new(inner: ResponseFuture<S, P, Req, T>, record_info: bool) -> Self {
        Self { inner, record_info }
    }
}

impl<S, Req, T, P> Future for HttpResponseFuture<S, Req, T, P>
where
    S: Service<Req>,
    S::Response: ResponseExtensions,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
{
    type Output = Result<S::Response, T::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let mut outcome = ready!(this.inner.as_mut().poll(cx));
        if let (Ok(response), true) = (&mut outcome, *this.record_info) {
            let info = RetryInfo::new(this.inner.attempts(), this.inner.slept());
            response.extensions_mut().insert(info);
        }
        Poll::Ready(outcome)
    }
}

impl<S, Req, T, P> fmt::Debug for HttpResponseFuture<S, Req, T, P>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponseFuture")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// A response with extensions, where the HTTP front-ends put the
/// [`RetryInfo`]: `http::Response` and `reqwest::Response`.
pub trait ResponseExtensions {
    /// The response's extensions.
    fn extensions_mut(&mut self) -> &mut Extensions;
}

impl<B> ResponseExtensions for Response<B> {
    fn extensions_mut(&mut self) -> &mut Extensions {
        Response::extensions_mut(self)
    }
}

#[cfg(feature = "reqwest")]
impl ResponseExtensions for reqwest::Response {
    fn extensions_mut(&mut self) -> &mut Extensions {
        reqwest::Response::extensions_mut(self)
    }
}
