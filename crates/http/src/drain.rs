//! Discarding a retried-away response without losing its connection.
//!
//! An HTTP/1 connection goes back to the pool only once its response body has
//! been read to the end; dropping the body unread makes hyper close it. So a
//! small body is read to the end by a spawned task (the caller is about to
//! sleep before the retry anyway, and the retry may reuse the connection), and
//! anything else is dropped: a closed connection is cheaper than reading a
//! large error page, and nothing stalls either way.

use std::time::Duration;

use http_body::Body;

/// Default most bytes read from a retried-away response body to save its
/// connection: 4 KiB, as go-retryablehttp does. Error pages from proxies and
/// rate limiters are smaller.
#[doc(hidden)]
pub const DEFAULT_DRAIN_LIMIT: usize = 4 * 1024;

/// Default longest time spent draining one body: a server that trickles a body
/// costs the connection, not a task that lives forever.
#[doc(hidden)]
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// Reads `body` to its end in the background when that is cheap, else drops it.
///
/// Draining happens only when the body is not known to be over `limit`, and a
/// tokio runtime is running (no runtime, no task: the body is simply dropped).
/// The task stops after `limit` bytes or `timeout`, whichever comes first.
pub(crate) fn drain<B>(body: B, limit: usize, timeout: Duration)
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    if limit == 0 || body.is_end_stream() || body.size_hint().lower() > limit as u64 {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let _ = tokio::time::timeout(timeout, read_to_end(body, limit)).await;
    });
}

/// Reads data frames until the body ends, fails, or passes `limit` bytes.
async fn read_to_end<B: Body>(body: B, limit: usize) {
    let mut body = std::pin::pin!(body);
    let mut read = 0usize;
    while read <= limit {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        match frame {
            Some(Ok(frame)) => {
                read = read.saturating_add(frame.data_ref().map_or(0, bytes::Buf::remaining));
            }
            Some(Err(_)) | None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body::Frame;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// A body of `chunks` one-byte frames that counts how many were read.
    struct Counted {
        chunks: usize,
        read: Arc<AtomicUsize>,
        hint: Option<u64>,
    }

    impl Body for Counted {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.chunks == 0 {
                return Poll::Ready(None);
            }
            self.chunks -= 1;
            self.read.fetch_add(1, Ordering::Relaxed);
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }

        fn size_hint(&self) -> http_body::SizeHint {
            self.hint
                .map(http_body::SizeHint::with_exact)
                .unwrap_or_default()
        }
    }

    fn counted(chunks: usize, hint: Option<u64>) -> (Counted, Arc<AtomicUsize>) {
        let read = Arc::new(AtomicUsize::new(0));
        let body = Counted {
            chunks,
            read: read.clone(),
            hint,
        };
        (body, read)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_small_body_is_read_to_the_end() {
        let (body, read) = counted(10, None);
        drain(body, 100, DEFAULT_DRAIN_TIMEOUT);
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 10);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_endless_body_is_read_only_past_the_limit() {
        let (body, read) = counted(usize::MAX, None);
        drain(body, 100, DEFAULT_DRAIN_TIMEOUT);
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 101);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_body_known_to_be_large_is_dropped_unread() {
        let (body, read) = counted(1000, Some(1000));
        drain(body, 100, DEFAULT_DRAIN_TIMEOUT);
        settle().await;
        assert_eq!(read.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn without_a_runtime_the_body_is_dropped_unread() {
        let (body, read) = counted(10, None);
        drain(body, 100, DEFAULT_DRAIN_TIMEOUT);
        assert_eq!(read.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_stalled_body_is_given_up_after_the_timeout() {
        struct Stalled {
            _alive: Arc<()>,
        }
        impl Body for Stalled {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
                Poll::Pending
            }
        }
        let alive = Arc::new(());
        drain(
            Stalled {
                _alive: alive.clone(),
            },
            100,
            Duration::from_secs(1),
        );
        settle().await;
        assert_eq!(Arc::strong_count(&alive), 2, "the task holds the body");
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(Arc::strong_count(&alive), 1, "the task dropped the body");
    }
}
