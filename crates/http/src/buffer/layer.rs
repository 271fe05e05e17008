//! [`BufferBodyLayer`]: applies [`BufferBody`] to a service.

use tower_layer::Layer;

use super::{BufferBody, DEFAULT_BUFFER_LIMIT};

/// Reads response bodies ahead, up to a limit, so the retry layer outside it
/// can classify them whole: see [`BufferBody`].
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use tower::ServiceBuilder;
/// use tower_backoff::http::{HttpPolicy};
/// use tower_backoff::http::parts::BufferBodyLayer;
/// use tower_backoff::BackoffLayer;
///
/// # let client = tower::service_fn(|_: http::Request<String>| async {
/// #     Ok::<_, std::io::Error>(http::Response::new(String::new()))
/// # });
/// let svc = ServiceBuilder::new()
///     .layer(BackoffLayer::builder().policy(HttpPolicy::new()).build().unwrap())
///     .layer(BufferBodyLayer::new().limit(16 * 1024))
///     .service(client);
/// # drop(svc);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BufferBodyLayer {
    limit: usize,
    known_length_only: bool,
}

impl BufferBodyLayer {
    /// Buffers bodies of up to [`DEFAULT_BUFFER_LIMIT`] bytes (64 KiB).
    pub const fn new() -> Self {
        Self {
            limit: DEFAULT_BUFFER_LIMIT,
            known_length_only: false,
        }
    }

    /// Buffers bodies of up to `bytes` bytes; a longer body is passed on
    /// unread past its first `bytes + 1` bytes (unread entirely when its
    /// `content-length` says so). Every value is accepted: `0` buffers only
    /// empty bodies, and memory is taken as bytes arrive, never reserved up
    /// front, so `usize::MAX` buffers every body whole, however large.
    pub const fn limit(mut self, bytes: usize) -> Self {
        self.limit = bytes;
        self
    }

    /// Reads ahead only bodies whose `content-length` is within the limit
    /// (see [`BufferBody::known_length_only`]).
    pub const fn known_length_only(mut self) -> Self {
        self.known_length_only = true;
        self
    }
}

impl Default for BufferBodyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for BufferBodyLayer {
    type Service = BufferBody<S>;

    fn layer(&self, inner: S) -> BufferBody<S> {
        let service = BufferBody::with_limit(inner, self.limit);
        if self.known_length_only {
            service.known_length_only()
        } else {
            service
        }
    }
}
