//! [`BufferedBody`]: a response body that [`BufferBody`](super::parts::BufferBody)
//! read ahead, served to the caller as if it had never been touched.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::http::HeaderMap;
use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

/// The body of a response that went through [`BufferBody`](crate::parts::BufferBody):
/// either the whole body, read within the limit, or the part read before the
/// limit followed by the rest of the original stream.
///
/// It reads like the body it replaces: the same bytes in the same order, the
/// same trailers, and the original body's errors (past the limit, the stream
/// is the server's, unread). Data frames are `Bytes`; a body whose frames
/// are already `Bytes` (hyper's `Incoming`, reqwest's `Body`) is not copied.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// use http::{Request, Response};
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, ServiceExt};
/// use tower_backoff::http::parts::BufferBody;
///
/// let client = service_fn(|_: Request<()>| async {
///     Ok::<_, std::io::Error>(Response::new(Full::new(bytes::Bytes::from("queue capacity"))))
/// });
/// let response = BufferBody::new(client).oneshot(Request::new(())).await?;
/// assert_eq!(response.body().bytes().unwrap().as_ref(), b"queue capacity");
/// let read = response.into_body().collect().await?.to_bytes();
/// assert_eq!(read.as_ref(), b"queue capacity");
/// # Ok(())
/// # }
/// ```
pub struct BufferedBody<B> {
    state: State<B>,
}

enum State<B> {
    /// Read to its end within the limit.
    Whole {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    /// Past the limit: what was read, then the rest of the original body.
    Streaming { prefix: VecDeque<Bytes>, rest: B },
}

impl<B> BufferedBody<B> {
    pub(super) fn whole(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            state: State::Whole { data, trailers },
        }
    }

    pub(super) fn streaming(prefix: VecDeque<Bytes>, rest: B) -> Self {
        Self {
            state: State::Streaming { prefix, rest },
        }
    }

    /// The whole body, when it was read within the limit and has not been
    /// polled yet; `None` for a body larger than the limit (or an empty one
    /// after it has been polled). An empty body read whole is `Some` of no
    /// bytes until polled.
    pub fn bytes(&self) -> Option<&Bytes> {
        static EMPTY: Bytes = Bytes::new();
        match &self.state {
            State::Whole {
                data: Some(data), ..
            } => Some(data),
            State::Whole { data: None, .. } => Some(&EMPTY),
            State::Streaming { .. } => None,
        }
    }

    /// Whether the body was read to its end within the limit.
    pub fn is_whole(&self) -> bool {
        matches!(self.state, State::Whole { .. })
    }
}

impl<B> Body for BufferedBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.state {
            State::Whole { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(
                    trailers
                        .take()
                        .map(|trailers| Ok(Frame::trailers(trailers))),
                )
            }
            State::Streaming { prefix, rest } => {
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Pin::new(rest).poll_frame(cx).map(|frame| {
                    frame.map(|frame| {
                        frame.map(|frame| {
                            frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
                        })
                    })
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.state {
            State::Whole { data, trailers } => data.is_none() && trailers.is_none(),
            State::Streaming { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Whole { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
            State::Streaming { prefix, rest } => {
                let read: u64 = prefix.iter().map(|chunk| chunk.len() as u64).sum();
                let rest = rest.size_hint();
                // Saturating on both bounds keeps lower <= upper, which
                // `SizeHint` asserts.
                let mut hint = SizeHint::new();
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint.set_lower(rest.lower().saturating_add(read));
                hint
            }
        }
    }
}

impl<B> fmt::Debug for BufferedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Whole { data, trailers } => f
                .debug_struct("BufferedBody::Whole")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            State::Streaming { prefix, .. } => f
                .debug_struct("BufferedBody::Streaming")
                .field("prefix_chunks", &prefix.len())
                .finish_non_exhaustive(),
        }
    }
}
