//! [`BufferBody`] for `reqwest::Client`: the same reading ahead, with
//! reqwest's own response and error types kept.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use ::http::response::Parts;
use pin_project_lite::pin_project;
use reqwest::{ResponseBuilderExt, Url};
use tower_service::Service;

use super::body::BufferedBody;
use super::collect::{Collect, Read, ReadAhead};
use super::{BufferBody, BufferedBytes};

impl<S> Service<reqwest::Request> for BufferBody<S>
where
    S: Service<reqwest::Request, Response = reqwest::Response>,
    S::Error: From<reqwest::Error>,
{
    type Response = reqwest::Response;
    type Error = S::Error;
    type Future = BufferReqwestFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        BufferReqwestFuture {
            state: State::Called {
                future: self.inner.call(request),
                read_ahead: self.read_ahead,
            },
        }
    }
}

pin_project! {
    /// The response future of [`BufferBody`] for `reqwest::Request`s: the
    /// inner service's response with its body read up to the limit.
    pub struct BufferReqwestFuture<F> {
        #[pin]
        state: State<F>,
    }
}

/// What reading a reqwest response keeps: its head, its URL (which the
/// conversion to `http::Response` drops) and the body being read.
type Reading = (Parts, Url, Collect<reqwest::Body>);

pin_project! {
    #[project = StateProj]
    enum State<F> {
        /// Waiting for the inner service's response.
        Called { #[pin] future: F, read_ahead: ReadAhead },
        /// Reading the body; `None` once the response has been returned.
        /// Boxed: only a response read ahead pays for the room, and a
        /// future this size is moved about by every request's caller.
        Reading { reading: Option<Box<Reading>> },
    }
}

impl<F, E> Future for BufferReqwestFuture<F>
where
    F: Future<Output = Result<reqwest::Response, E>>,
    E: From<reqwest::Error>,
{
    type Output = Result<reqwest::Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Called { future, read_ahead } => {
                    let response = ready!(future.poll(cx))?;
                    let Some(limit) = read_ahead.limit_for(response.headers()) else {
                        return Poll::Ready(Ok(response));
                    };
                    let url = response.url().clone();
                    let (parts, body) = ::http::Response::from(response).into_parts();
                    let collect = Collect::new(body, limit);
                    state.set(State::Reading {
                        reading: Some(Box::new((parts, url, collect))),
                    });
                }
                StateProj::Reading { reading } => {
                    let Some((_, _, collect)) = reading.as_deref_mut() else {
                        panic!("BufferReqwestFuture polled after completion");
                    };
                    let collected = ready!(collect.poll_collect(cx))?;
                    let (parts, url, collect) = *reading.take().expect("read just above");
                    return Poll::Ready(Ok(rebuild(parts, url, collect.finish(collected))));
                }
            }
        }
    }
}

/// The `reqwest::Response` again, with its URL and the body read ahead. A
/// body read whole without trailers goes back as reqwest's own body of
/// bytes, which it serves without a box of ours around it.
fn rebuild(parts: Parts, url: Url, read: Read<reqwest::Body>) -> reqwest::Response {
    let (body, whole) = match read {
        Read::Whole {
            data,
            trailers: None,
        } => (reqwest::Body::from(data.clone()), Some(data)),
        Read::Whole { data, trailers } => (
            reqwest::Body::wrap(BufferedBody::<reqwest::Body>::whole(data.clone(), trailers)),
            Some(data),
        ),
        Read::OverLimit { prefix, rest } => (
            reqwest::Body::wrap(BufferedBody::streaming(prefix, rest)),
            None,
        ),
    };
    // reqwest reads a response's URL back from an extension only its own
    // response builder can write: the head starts from that builder's, so
    // the URL's map is the one the other extensions join.
    let (mut head, ()) = ::http::Response::builder()
        .url(url)
        .body(())
        .unwrap_or_default()
        .into_parts();
    head.status = parts.status;
    head.version = parts.version;
    head.headers = parts.headers;
    head.extensions.extend(parts.extensions);
    if let Some(data) = whole {
        BufferedBytes::record_bytes(&mut head.extensions, data);
    }
    reqwest::Response::from(::http::Response::from_parts(head, body))
}
