//! A6's throttle accounting for a committed call: counted when its trailers
//! say how it ended, not when its headers arrived.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::http::header::HeaderName;
use ::http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::policy::GrpcPolicy;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

pin_project! {
    /// The response body of [`GrpcRetry`](crate::GrpcRetry): the channel's
    /// body, unchanged, whose trailers count for the config's
    /// `retryThrottling` when the call was committed (its headers carried
    /// no status, so how it ended is known only from them).
    ///
    /// Trailers with `OK` add `tokenRatio`; a status the method retries (or
    /// a pushback saying not to retry) takes a token, as A6 counts every
    /// failed call; any other status, a body that fails or ends without
    /// trailers, and a body dropped before its end count neither way.
    pub struct GrpcBody<B> {
        #[pin]
        inner: B,
        // The method's policy, with the throttle, until the trailers count.
        counts: Option<GrpcPolicy>,
    }
}

impl<B> GrpcBody<B> {
    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwraps the body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for GrpcBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    if let Some(policy) = this.counts.take() {
                        policy.count_trailers(trailers);
                    }
                }
            }
            // An error or the end without trailers: neither way.
            Some(Err(_)) | None => *this.counts = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: fmt::Debug> fmt::Debug for GrpcBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcBody")
            .field("inner", &self.inner)
            .field("counts_trailers", &self.counts.is_some())
            .finish()
    }
}

pin_project! {
    /// A response future whose response gets a [`GrpcBody`].
    #[doc(hidden)]
    pub struct Committed<F> {
        #[pin]
        inner: F,
        // The method's policy when the channel has a throttle.
        policy: Option<GrpcPolicy>,
    }
}

impl<F> Committed<F> {
    pub(crate) fn new(inner: F, policy: Option<GrpcPolicy>) -> Self {
        Self { inner, policy }
    }
}

impl<F, B, E> Future for Committed<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<GrpcBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        // Committed: OK headers without a status (a trailers-only answer
        // was counted as it was classified).
        let committed =
            response.status() == StatusCode::OK && !response.headers().contains_key(GRPC_STATUS);
        let counts = this.policy.take().filter(|_| committed);
        Poll::Ready(Ok(response.map(|inner| GrpcBody { inner, counts })))
    }
}

impl<F: fmt::Debug> fmt::Debug for Committed<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Committed")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
