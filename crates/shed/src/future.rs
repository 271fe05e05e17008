//! [`ResponseFuture`]: the inner service's answer, holding its place among
//! those in flight, or the rejection ready at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::body::{grpc_failed, ShedBody};
use crate::limiter::Permit;

pin_project! {
    /// The future of [`Shed`](crate::Shed).
    ///
    /// # Cancel safety
    /// Dropped before it is done, it frees its place without measuring the
    /// request's latency.
    #[derive(Debug)]
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F, B> {
        Admitted { #[pin] future: F, permit: Option<Permit> },
        Rejected { response: Option<Response<ShedBody<B>>> },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn admitted(future: F, permit: Permit) -> Self {
        Self {
            state: State::Admitted {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejected(response: Response<ShedBody<B>>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ShedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, permit } => {
                // An error frees the place unmeasured, as the permit drops.
                let response = std::task::ready!(future.poll(cx))?;
                let Some(permit) = permit.take() else {
                    // Polled after it was done: stays pending rather than panic.
                    return Poll::Pending;
                };
                let healthy =
                    !response.status().is_server_error() && !grpc_failed(response.headers());
                Poll::Ready(Ok(
                    response.map(|body| ShedBody::admitted(body, permit, healthy))
                ))
            }
            StateProj::Rejected { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled after it was done: stays pending rather than panic.
                None => Poll::Pending,
            },
        }
    }
}
