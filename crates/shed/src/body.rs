//! [`ShedBody`]: the response body, holding its request's place among those
//! in flight until it ends, when the request's latency is measured.
//!
//! A server-streaming gRPC call, server-sent events or a download work until
//! their body ends, not until their headers are ready: the place is freed,
//! and the latency taken, only there. A body dropped before its end, or
//! ending in an error, frees the place without a measurement; so does a
//! failure (a 5xx, or a gRPC status that says the server failed), whose
//! latency says nothing of what healthy service costs.

use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::limiter::Permit;
use crate::rejection::GRPC_STATUS;

pin_project! {
    /// The body of [`Shed`](crate::Shed)'s responses: the inner service's
    /// body, or a rejection's empty one.
    ///
    /// # Cancel safety
    /// Dropped before its end, it frees its place without measuring.
    #[derive(Debug)]
    pub struct ShedBody<B> {
        #[pin]
        inner: Option<B>,
        permit: Option<Permit>,
        healthy: bool,
    }
}

impl<B: Body> ShedBody<B> {
    /// `inner`, holding `permit` until it ends. A body already at its end
    /// frees the place at once: a server need not poll it.
    pub(crate) fn admitted(inner: B, permit: Permit, healthy: bool) -> Self {
        let mut body = Self {
            inner: Some(inner),
            permit: Some(permit),
            healthy,
        };
        if body.inner.as_ref().is_some_and(B::is_end_stream) {
            finish(&mut body.permit, body.healthy);
        }
        body
    }
}

impl<B> ShedBody<B> {
    /// A rejection's body: empty.
    pub(crate) fn empty() -> Self {
        Self {
            inner: None,
            permit: None,
            healthy: true,
        }
    }
}

impl<B> Default for ShedBody<B> {
    fn default() -> Self {
        Self::empty()
    }
}

/// Frees the place; measures the latency only when the request succeeded.
fn finish(permit: &mut Option<Permit>, healthy: bool) {
    if let Some(permit) = permit.take() {
        if healthy {
            permit.complete(tokio::time::Instant::now().into_std());
        }
    }
}

/// gRPC codes that say the server failed, as a 5xx does: `UNKNOWN`,
/// `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `INTERNAL`, `UNAVAILABLE`,
/// `DATA_LOSS`.
pub(crate) fn grpc_failed(headers: &HeaderMap) -> bool {
    if headers.is_empty() {
        return false;
    }
    headers
        .get(GRPC_STATUS)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .and_then(|v| v.trim().parse::<u16>().ok())
        .is_some_and(|code| matches!(code, 2 | 4 | 8 | 13 | 14 | 15))
}

impl<B: Body> Body for ShedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let Some(mut inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(inner.as_mut().poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if frame.trailers_ref().is_some_and(grpc_failed) {
                    *this.healthy = false;
                }
                if inner.is_end_stream() {
                    finish(this.permit, *this.healthy);
                }
            }
            Some(Err(_)) => {
                this.permit.take();
            }
            None => finish(this.permit, *this.healthy),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(B::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), B::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};

    use super::*;
    use crate::{Limiter, Priority};

    fn trailers(status: &'static str) -> HeaderMap {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static(status));
        trailers
    }

    /// Streams of one message and gRPC trailers `status`, each admitted and
    /// read to its end.
    fn serve(limiter: &Limiter, status: &'static str) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            for _ in 0..50 {
                let permit = limiter
                    .try_acquire(Priority::HIGHEST, tokio::time::Instant::now().into_std())
                    .unwrap();
                let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
                    Ok(Frame::data(Bytes::from_static(b"message"))),
                    Ok(Frame::trailers(trailers(status))),
                ];
                let body = ShedBody::admitted(
                    StreamBody::new(futures::stream::iter(frames)),
                    permit,
                    true,
                );
                tokio::time::sleep(Duration::from_millis(40)).await;
                body.collect().await.unwrap();
            }
        });
    }

    #[test]
    fn a_grpc_failure_in_the_trailers_teaches_nothing_and_a_success_does() {
        let failing = Limiter::builder().seed(1).build().unwrap();
        serve(&failing, "14");
        assert_eq!(failing.baseline(), None);
        assert_eq!(failing.in_flight(), 0);
        let healthy = Limiter::builder().seed(1).build().unwrap();
        serve(&healthy, "0");
        assert!(healthy.baseline().is_some());
    }

    #[test]
    fn an_empty_body_frees_its_place_at_once_as_no_server_polls_it() {
        let limiter = Limiter::builder().seed(1).build().unwrap();
        let permit = limiter
            .try_acquire(Priority::HIGHEST, Instant::now())
            .unwrap();
        let body = ShedBody::admitted(Full::new(Bytes::new()), permit, true);
        assert_eq!(limiter.in_flight(), 0);
        assert!(body.is_end_stream());
    }
}
