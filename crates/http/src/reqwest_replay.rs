//! Replayable `reqwest` bodies: [`Replay`] takes a `reqwest::Request` and
//! records its body, [`IntoReqwestLayer`] turns the copies back into
//! `reqwest::Request`s for the client.

use std::any::Any;
use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use ::http::Request;
use bytes::Bytes;
use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::replay::ReplayBody;
use super::replay_layer::Replay;

type BoxError = Box<dyn Error + Send + Sync>;

/// `reqwest::Client` behind a [`ReplayLayer`](super::parts::ReplayLayer): the
/// request becomes an `http::Request` whose body is a [`ReplayBody`], so a
/// streaming body (`reqwest::Body::wrap_stream`) is retried like any other,
/// up to the replay limit. A body already in memory (bytes, a string, JSON)
/// is recorded whatever its size, since recording it shares its bytes, and
/// goes out as those bytes, so reqwest follows a 307 or 308 redirect with it
/// as it does without the layer.
///
/// The request's timeout and version go along with it. A URL that is not a
/// valid `http::Uri` (which reqwest itself would refuse to send) fails the
/// call with reqwest's own builder error, before anything is sent.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use tower::ServiceBuilder;
/// use tower_backoff::http::{HttpPolicy};
/// use tower_backoff::http::parts::{IntoReqwestLayer, ReplayLayer};
/// use tower_backoff::BackoffLayer;
///
/// let client = ServiceBuilder::new()
///     .layer(ReplayLayer::new())
///     .layer(BackoffLayer::builder().policy(HttpPolicy::new()).build().unwrap())
///     .layer(IntoReqwestLayer)
///     .service(reqwest::Client::new());
/// # drop(client);
/// ```
impl<S> Service<reqwest::Request> for Replay<S>
where
    S: Service<Request<ReplayBody<reqwest::Body>>>,
    S::Error: From<reqwest::Error>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ReqwestFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        match Request::<reqwest::Body>::try_from(request) {
            Ok(request) => {
                let limit = self.limit;
                ReqwestFuture::called(self.inner.call(request.map(|body| record(body, limit))))
            }
            Err(error) => ReqwestFuture::failed(error.into()),
        }
    }
}

/// `body` recorded up to `limit` bytes, or whole if it is already in memory.
pub(crate) fn record(mut body: reqwest::Body, limit: usize) -> ReplayBody<reqwest::Body> {
    match take_in_memory(&mut body) {
        Some(bytes) => ReplayBody::from_bytes(bytes),
        None => ReplayBody::with_limit(body, limit),
    }
}

/// The bytes of a body reqwest holds in memory, taken out without a copy:
/// such a body yields them whole to its first poll, at once.
pub(crate) fn take_in_memory(body: &mut reqwest::Body) -> Option<Bytes> {
    body.as_bytes()?;
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().ok(),
        Poll::Ready(None) => Some(Bytes::new()),
        Poll::Ready(Some(Err(_))) | Poll::Pending => None,
    }
}

/// The body reqwest sends for one attempt. A body that was in memory goes
/// as its bytes (a `Bytes` clone), which reqwest copies itself to follow a
/// 307 or 308 redirect, as it does without the layer; it cannot copy a
/// wrapped body, and would return the redirect instead. Any other body goes
/// through its recording.
///
/// `B` is any body so that [`IntoReqwest`] takes any; the one it is given
/// behind a [`ReplayLayer`](super::parts::ReplayLayer) is the body recorded
/// here, found by its type.
pub(crate) fn attempt_body<B>(body: B) -> reqwest::Body
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let recorded = (&body as &dyn Any).downcast_ref::<ReplayBody<reqwest::Body>>();
    match recorded.and_then(ReplayBody::in_memory) {
        Some(bytes) => reqwest::Body::from(bytes.clone()),
        None => reqwest::Body::wrap(body),
    }
}

/// Turns `http::Request`s into `reqwest::Request`s, the requests
/// `reqwest::Client` takes: the inside half of a
/// [`ReplayLayer`](super::parts::ReplayLayer) in front of reqwest (see the example
/// there). A body the `ReplayLayer` took from memory goes as its bytes, so
/// reqwest can follow a 307 or 308 redirect with it; others go in with
/// `reqwest::Body::wrap`.
#[derive(Debug, Clone, Copy, Default)]
pub struct IntoReqwestLayer;

impl<S> Layer<S> for IntoReqwestLayer {
    type Service = IntoReqwest<S>;

    fn layer(&self, inner: S) -> IntoReqwest<S> {
        IntoReqwest { inner }
    }
}

/// The service of [`IntoReqwestLayer`].
#[derive(Debug, Clone)]
pub struct IntoReqwest<S> {
    inner: S,
}

impl<S> IntoReqwest<S> {
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

impl<S, B> Service<Request<B>> for IntoReqwest<S>
where
    S: Service<reqwest::Request>,
    S::Error: From<reqwest::Error>,
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ReqwestFuture<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match reqwest::Request::try_from(request.map(attempt_body)) {
            Ok(request) => ReqwestFuture::called(self.inner.call(request)),
            Err(error) => ReqwestFuture::failed(error.into()),
        }
    }
}

pin_project! {
    /// The response future of [`Replay`] and [`IntoReqwest`] for reqwest:
    /// the inner service's, or the error of a request that could not be
    /// converted and so was never sent.
    pub struct ReqwestFuture<F, E> {
        #[pin]
        state: State<F, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, E> {
        Called { #[pin] future: F },
        Failed { error: Option<E> },
    }
}

impl<F, E> ReqwestFuture<F, E> {
    pub(crate) fn called(future: F) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    pub(crate) fn failed(error: E) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl<F, T, E> Future for ReqwestFuture<F, E>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future } => future.poll(cx),
            StateProj::Failed { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                // Polled again after it returned: it stays pending, as a
                // fused future would, rather than panic.
                None => Poll::Pending,
            },
        }
    }
}

impl<F, E> std::fmt::Debug for ReqwestFuture<F, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Called { .. } => "Called",
            State::Failed { .. } => "Failed",
        };
        f.debug_struct("ReqwestFuture")
            .field("state", &state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn a_failed_future_returns_its_error_once_then_stays_pending() {
        let mut future =
            ReqwestFuture::<std::future::Ready<Result<(), &str>>, &str>::failed("unsendable");
        let mut cx = Context::from_waker(Waker::noop());
        let mut future = Pin::new(&mut future);
        assert_eq!(
            future.as_mut().poll(&mut cx),
            Poll::Ready(Err("unsendable"))
        );
        assert_eq!(future.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(format!("{future:?}"), "ReqwestFuture { state: \"Failed\" }");
    }

    #[test]
    fn a_called_future_is_the_inner_future() {
        let mut future = ReqwestFuture::<_, &str>::called(std::future::ready(Ok::<_, &str>(7)));
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready(Ok(7)));
        assert_eq!(format!("{future:?}"), "ReqwestFuture { state: \"Called\" }");
    }

    #[tokio::test]
    async fn a_body_in_memory_is_recorded_whatever_its_size_and_a_stream_up_to_the_limit() {
        use super::super::body::CloneBody;
        use http_body_util::BodyExt;

        let in_memory = record(reqwest::Body::from(vec![1u8; 100]), 10);
        let copy = in_memory.clone_body().unwrap();
        assert_eq!(in_memory.collect().await.unwrap().to_bytes().len(), 100);
        assert!(copy.is_replayable());

        let frames = [Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(
            vec![1u8; 100],
        )))];
        let stream = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let streaming = record(reqwest::Body::wrap(stream), 10);
        let copy = streaming.clone_body().unwrap();
        assert_eq!(streaming.collect().await.unwrap().to_bytes().len(), 100);
        assert!(!copy.is_replayable());
    }

    #[test]
    fn a_body_in_memory_goes_out_as_its_own_bytes_and_a_stream_through_its_recording() {
        use super::super::body::CloneBody;

        let bytes = Bytes::from(vec![7u8; 100]);
        let recorded = record(reqwest::Body::from(bytes.clone()), 10);
        let copy = recorded.clone_body().unwrap();
        for attempt in [recorded, copy] {
            let sent = attempt_body(attempt);
            // The same bytes, not a copy: reqwest can copy this body itself.
            assert_eq!(sent.as_bytes().map(<[u8]>::as_ptr), Some(bytes.as_ptr()));
        }
        let empty = attempt_body(record(reqwest::Body::from(""), 10));
        assert_eq!(empty.as_bytes(), Some(&b""[..]));

        let frames = [Ok::<_, BoxError>(http_body::Frame::data(Bytes::from("x")))];
        let stream = http_body_util::StreamBody::new(futures::stream::iter(frames));
        let streaming = record(reqwest::Body::wrap(stream), 10);
        assert!(attempt_body(streaming).as_bytes().is_none());
        // Only what `record` made of a body in memory goes as bytes.
        let other = http_body_util::Full::new(Bytes::from("x"));
        assert!(attempt_body(other).as_bytes().is_none());
    }
}
