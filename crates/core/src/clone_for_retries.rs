//! [`CloneForRetries`]: the one thing the layer asks of the service it wraps,
//! named so that a compile error says what is missing.

/// A service the retry layer can wrap: one it can clone, because each retry
/// is sent through a clone of the service (as `tower::retry` does), so that
/// the request in flight never holds `&mut` of it across the sleep.
///
/// Every `Clone` type is one; nothing implements this by hand. A service
/// that is not `Clone` (a `tower::limit::RateLimit` or `ConcurrencyLimit`
/// inside the layer, a client held by value, a `service_fn` over a closure
/// that owns state) fails to compile with `the trait bound `S:
/// CloneForRetries` is not satisfied`. Wrap it in [`tower::buffer::Buffer`],
/// which is `Clone` and shares the one inner service:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # use tower_backoff_core as tower_backoff;
/// use std::time::Duration;
/// use tower::{buffer::Buffer, limit::RateLimit, service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::BackoffLayer;
///
/// // `RateLimit` is not `Clone`: `Buffer` makes the stack cloneable.
/// let limited = RateLimit::new(
///     service_fn(|n: u32| async move { Ok::<_, std::io::Error>(n * 2) }),
///     tower::limit::rate::Rate::new(100, Duration::from_secs(1)),
/// );
/// let service = ServiceBuilder::new()
///     .layer(BackoffLayer::new())
///     .service(Buffer::new(limited, 64));
/// assert_eq!(service.oneshot(21).await.unwrap(), 42);
/// # }
/// ```
///
/// [`tower::buffer::Buffer`]: https://docs.rs/tower/latest/tower/buffer/struct.Buffer.html
#[diagnostic::on_unimplemented(
    message = "the retry layer needs a service it can clone, and `{Self}` is not `Clone`",
    label = "not `Clone`: each retry goes through a clone of the service",
    note = "wrap the service in `tower::buffer::Buffer` (`ServiceBuilder::buffer`), which is `Clone`, or derive `Clone` if cloning it is cheap"
)]
pub trait CloneForRetries: Clone {}

// `do_not_recommend`: the compiler then reports the missing bound as this
// trait, with the message above, rather than as a bare missing `Clone`.
#[diagnostic::do_not_recommend]
impl<S: Clone> CloneForRetries for S {}
