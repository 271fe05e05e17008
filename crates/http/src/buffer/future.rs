//! [`BufferBodyFuture`]: waits for the response, then reads its body up to
//! the limit.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::http::response::Parts;
use ::http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use tower::BoxError;

use super::body::BufferedBody;
use super::collect::{Collect, ReadAhead};
use super::BufferedBytes;

pin_project! {
    /// The response future of [`BufferBody`](super::parts::BufferBody) for
    /// `http::Request`s: the inner service's response with its body read up
    /// to the limit.
    pub struct BufferBodyFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        /// Waiting for the inner service's response.
        Called { #[pin] future: F, read_ahead: ReadAhead },
        /// Reading the body; `None` once the response has been returned.
        /// Boxed: only a response read ahead pays for the room, and a
        /// future this size is moved about by every request's caller.
        Reading { reading: Option<Box<(Parts, Collect<B>)>> },
    }
}

impl<F, B> BufferBodyFuture<F, B> {
    pub(super) fn new(future: F, read_ahead: ReadAhead) -> Self {
        Self {
            state: State::Called { future, read_ahead },
        }
    }
}

impl<F, B, E> Future for BufferBodyFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<BufferedBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Called { future, read_ahead } => {
                    let (parts, body) = ready!(future.poll(cx)).map_err(Into::into)?.into_parts();
                    let Some(limit) = read_ahead.limit_for(&parts.headers) else {
                        let body = Collect::untouched(body);
                        return Poll::Ready(Ok(Response::from_parts(parts, body)));
                    };
                    let collect = Collect::new(body, limit);
                    state.set(State::Reading {
                        reading: Some(Box::new((parts, collect))),
                    });
                }
                StateProj::Reading { reading } => {
                    let Some((_, collect)) = reading.as_deref_mut() else {
                        panic!("BufferBodyFuture polled after completion");
                    };
                    // A body that fails within the limit is the attempt's
                    // outcome: the error, as the body gave it.
                    let collected = ready!(collect.poll_collect(cx)).map_err(Into::into)?;
                    let (mut parts, collect) = *reading.take().expect("read just above");
                    let body = collect.into_body(collected);
                    BufferedBytes::record(&mut parts.extensions, &body);
                    return Poll::Ready(Ok(Response::from_parts(parts, body)));
                }
            }
        }
    }
}
