//! Which transport errors are transient: found by walking an error's `source()`
//! chain, whatever wraps it.

use std::error::Error;
use std::io;

use tower_backoff_core::policy::Cause;

/// How deep [`classify_error`] and [`is_unsent`] look. Real chains are a
/// handful of links; the bound keeps a cyclic or absurdly deep chain from
/// stalling the client.
const MAX_DEPTH: usize = 32;

/// Whether `error`, or any error in its `source()` chain, is worth another
/// attempt, and why; `None` for anything else.
///
/// Looked for, from the outermost error in (an `io::Error` wrapping an error
/// is followed into it, though its `source()` skips it):
/// - timeouts, [`Cause::Timeout`]: `tower::timeout::error::Elapsed`,
///   `tokio::time::error::Elapsed`, a hyper timeout, an `io::Error` of kind
///   `TimedOut`, a `reqwest::Error` whose `is_timeout()` (with the `reqwest`
///   feature);
/// - connection failures, [`Cause::Transient`]: a hyper-util client error whose
///   `is_connect()` (refused, unreachable, DNS), a `reqwest::Error` whose
///   `is_connect()`, an `io::Error` of kind `ConnectionReset`,
///   `ConnectionRefused`, `ConnectionAborted` or `BrokenPipe`, and hyper's
///   "connection closed before message completed" (a pooled connection the
///   server closed as the request went out);
/// - a body cut short, [`Cause::Transient`]: an `io::Error` of kind
///   `UnexpectedEof`, which hyper gives when the connection closes before
///   `content-length` bytes or the last chunk arrived (read by a
///   [`BufferBody`](super::parts::BufferBody));
/// - with the `http2` feature, HTTP/2 stream resets (`RST_STREAM`) and
///   `GOAWAY`s, [`Cause::Transient`] as a reset HTTP/1 connection is:
///   - from the server, whatever their reason but three: `ENHANCE_YOUR_CALM`
///     (the server finds this client too busy) is [`Cause::Throttled`];
///     `HTTP_1_1_REQUIRED` and `INADEQUATE_SECURITY` are final, as the
///     server would answer every attempt the same;
///   - from this side's `h2`, on finding what the server sent wrong: a body
///     shorter or longer than its `content-length` (`PROTOCOL_ERROR`) is a
///     body cut short; a response head over `h2`'s limits (`REFUSED_STREAM`,
///     `ENHANCE_YOUR_CALM`) is final, as HTTP/1's "response head too large";
///   - one this side sent for its own reasons is final, and an I/O error
///     inside an HTTP/2 error is read as above.
///
///   Without the feature none of these is retried: hyper does not say why
///   an HTTP/2 stream ended, only `h2`'s error type does.
///
/// The policy only sends a request twice when its method is idempotent or it
/// carries an idempotency key, so retrying a reset in the middle of a request
/// is safe.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::io;
/// use tower_backoff::Cause;
/// use tower_backoff::http::classify_error;
///
/// let reset: Box<dyn std::error::Error + Send + Sync> =
///     io::Error::from(io::ErrorKind::ConnectionReset).into();
/// assert_eq!(classify_error(&*reset), Some(Cause::Transient));
///
/// let denied = io::Error::from(io::ErrorKind::PermissionDenied);
/// assert_eq!(classify_error(&denied), None);
/// ```
pub fn classify_error(error: &(dyn Error + 'static)) -> Option<Cause> {
    find_in_chain(error, classify_one)
}

/// Whether `error`, or any error in its `source()` chain, proves that the
/// request never reached the server, so that sending it again cannot repeat
/// anything the server did: what
/// [`HttpPolicy::retry_unsent`](super::HttpPolicy::retry_unsent) retries.
///
/// Recognised:
/// - a hyper-util client error whose `is_connect()`: the connection was
///   never made (refused, unreachable, DNS failure, connect timeout, TLS
///   handshake failure, a proxy tunnel refused), so no byte of the request
///   was written;
/// - a `reqwest::Error` whose `is_connect()` (with the `reqwest` feature):
///   reqwest's name for the same hyper-util error;
/// - a hyper error whose `is_canceled()`: hyper handed the request back
///   before writing any of it (a pooled connection found closed, or not
///   ready, when the request was queued on it). hyper-util retries these
///   itself on a reused connection; this covers the rest;
/// - an `io::Error` of kind `ConnectionRefused`: no connection, no request;
/// - with the `http2` feature, an HTTP/2 stream the server reset with
///   `REFUSED_STREAM`, which says that it did not process any of it
///   (RFC 9113, 8.7), or one a server's `GOAWAY` ended: `h2` gives that
///   error only to the streams after the last one the `GOAWAY` names, which
///   the server did not process (RFC 9113, 6.8), and to streams opened
///   after it.
///
/// Not recognised, because the request may have been written and processed:
/// a reset or broken pipe (`ConnectionReset`, `ConnectionAborted`,
/// `BrokenPipe`), hyper's "connection closed before message completed"
/// (`is_incomplete_message()`), any other HTTP/2 reset, timeouts, and
/// anything else.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::io;
/// use tower_backoff::http::is_unsent;
///
/// assert!(is_unsent(&io::Error::from(io::ErrorKind::ConnectionRefused)));
/// assert!(!is_unsent(&io::Error::from(io::ErrorKind::ConnectionReset)));
/// ```
pub fn is_unsent(error: &(dyn Error + 'static)) -> bool {
    find_in_chain(error, |error| proves_unsent(error).then_some(())).is_some()
}

/// The first answer `look` gives walking down `error`'s chain: `error`, then
/// its `source()`, and so on, looking inside an `io::Error` at the error it
/// wraps (its own `source()` skips that one) and, with the `http2` feature,
/// inside an `h2::Error` at its I/O error (it has no `source()`), at most 32
/// links deep (a chain may be a cycle). What every classifier of the crate
/// walks.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::io;
/// use tower_backoff::http::find_in_chain;
///
/// let wrapped = io::Error::other(std::fmt::Error);
/// assert!(find_in_chain(&wrapped, |e| e.downcast_ref::<std::fmt::Error>()).is_some());
/// ```
pub fn find_in_chain<'a, T>(
    error: &'a (dyn Error + 'static),
    mut look: impl FnMut(&'a (dyn Error + 'static)) -> Option<T>,
) -> Option<T> {
    let mut next = Some(error);
    for _ in 0..MAX_DEPTH {
        let error = next?;
        if let Some(found) = look(error) {
            return Some(found);
        }
        next = next_link(error);
    }
    None
}

fn proves_unsent(error: &(dyn Error + 'static)) -> bool {
    #[cfg(feature = "http2")]
    if error
        .downcast_ref::<h2::Error>()
        .is_some_and(h2_unprocessed)
    {
        return true;
    }
    #[cfg(feature = "hyper")]
    let (connect, canceled) = (
        error
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(hyper_util::client::legacy::Error::is_connect),
        error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled),
    );
    #[cfg(not(feature = "hyper"))]
    let (connect, canceled) = (false, false);
    #[cfg(feature = "reqwest")]
    let connect = connect
        || error
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_connect);
    connect
        || canceled
        || error
            .downcast_ref::<io::Error>()
            .is_some_and(|error| error.kind() == io::ErrorKind::ConnectionRefused)
}

/// The next error down the chain. `io::Error::source()` skips the error an
/// `io::Error` wraps and returns that error's own source, so a timeout or a
/// reset wrapped by an I/O adapter would go unseen: look at it first. An
/// `h2::Error` has no `source()`: the connection reset or closed under an
/// HTTP/2 body is its I/O error.
fn next_link<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a (dyn Error + 'static)> {
    if let Some(wrapped) = error
        .downcast_ref::<io::Error>()
        .and_then(io::Error::get_ref)
    {
        return Some(wrapped);
    }
    #[cfg(feature = "http2")]
    if let Some(io) = error
        .downcast_ref::<h2::Error>()
        .and_then(h2::Error::get_io)
    {
        return Some(io);
    }
    error.source()
}

/// Whether the server provably did not process the stream: it refused it
/// (`REFUSED_STREAM`, RFC 9113, 8.7), or its `GOAWAY` named an earlier last
/// stream. h2 hands a server's `GOAWAY` only to the streams after the last
/// one it names, and to those opened after it (RFC 9113, 6.8); the streams
/// it may have processed end with their connection, an I/O error. A stream
/// this side's h2 refused (a response head over its size limit) was
/// processed.
#[cfg(feature = "http2")]
fn h2_unprocessed(error: &h2::Error) -> bool {
    error.is_remote() && (error.is_go_away() || error.reason() == Some(h2::Reason::REFUSED_STREAM))
}

/// What an HTTP/2 reset or `GOAWAY` means for a retry. `None` for an I/O
/// error (the next link, read as any), and for a reset or `GOAWAY` this side
/// sent itself (hyper resetting a stream whose request body failed, say):
/// that says nothing about the server.
#[cfg(feature = "http2")]
fn classify_h2(error: &h2::Error) -> Option<Cause> {
    use h2::Reason;
    let reason = error.reason()?;
    if error.is_library() {
        // This side's h2 found what the server sent wrong. A head over the
        // size limit (refused) or past the abuse limit (calm) comes the same
        // every time, as HTTP/1's "response head too large"; a body shorter
        // or longer than its content-length is a PROTOCOL_ERROR, which reads
        // as HTTP/1's body cut short.
        return match reason {
            Reason::REFUSED_STREAM | Reason::ENHANCE_YOUR_CALM => None,
            _ => Some(Cause::Transient),
        };
    }
    if (error.is_reset() || error.is_go_away()) && !error.is_remote() {
        return None;
    }
    match reason {
        Reason::ENHANCE_YOUR_CALM => Some(Cause::Throttled),
        // The server would say the same to every attempt.
        Reason::HTTP_1_1_REQUIRED | Reason::INADEQUATE_SECURITY => None,
        _ => Some(Cause::Transient),
    }
}

fn classify_one(error: &(dyn Error + 'static)) -> Option<Cause> {
    if error.is::<tower::timeout::error::Elapsed>()
        || error.is::<tokio::time::error::Elapsed>()
        || error.is::<tower_backoff_core::error::TimedOut>()
    {
        return Some(Cause::Timeout);
    }
    #[cfg(feature = "hyper")]
    if let Some(error) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
        if error.is_connect() {
            return Some(Cause::Transient);
        }
    }
    #[cfg(feature = "hyper")]
    if let Some(error) = error.downcast_ref::<hyper::Error>() {
        if error.is_timeout() {
            return Some(Cause::Timeout);
        }
        if error.is_incomplete_message() {
            return Some(Cause::Transient);
        }
    }
    #[cfg(feature = "reqwest")]
    if let Some(error) = error.downcast_ref::<reqwest::Error>() {
        if error.is_timeout() {
            return Some(Cause::Timeout);
        }
        if error.is_connect() {
            return Some(Cause::Transient);
        }
    }
    #[cfg(feature = "http2")]
    if let Some(error) = error.downcast_ref::<h2::Error>() {
        return classify_h2(error);
    }
    if let Some(error) = error.downcast_ref::<io::Error>() {
        return match error.kind() {
            io::ErrorKind::TimedOut => Some(Cause::Timeout),
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Some(Cause::Transient),
            _ => None,
        };
    }
    None
}

/// An error type whose `source()` chain the HTTP policy can walk.
///
/// Implemented for the error types of the clients the policy is meant for
/// (hyper, hyper-util, reqwest, `tower::timeout`, `tower::buffer` and other
/// layers that box their errors). Implement it for your own error type in one
/// line:
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use tower_backoff::http::AsStdError;
///
/// #[derive(Debug)]
/// struct MyError;
/// impl std::fmt::Display for MyError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("my error")
///     }
/// }
/// impl std::error::Error for MyError {}
///
/// impl AsStdError for MyError {
///     fn as_std_error(&self) -> &(dyn std::error::Error + 'static) {
///         self
///     }
/// }
/// ```
///
/// It exists because `Box<dyn Error + Send + Sync>`, the error of every tower
/// middleware that boxes, does not itself implement `Error`, so no single bound
/// covers both it and a concrete error type.
pub trait AsStdError {
    /// The error as a trait object, for `source()` and `downcast_ref`.
    fn as_std_error(&self) -> &(dyn Error + 'static);
}

impl AsStdError for Box<dyn Error + Send + Sync> {
    fn as_std_error(&self) -> &(dyn Error + 'static) {
        &**self
    }
}

impl AsStdError for Box<dyn Error + Send> {
    fn as_std_error(&self) -> &(dyn Error + 'static) {
        &**self
    }
}

impl AsStdError for Box<dyn Error> {
    fn as_std_error(&self) -> &(dyn Error + 'static) {
        &**self
    }
}

/// The HTTP policy classifies what ended the attempt: the inner error as it
/// would without attempt timeouts, or the time-out. (The breaker's rejection
/// ends a request before any attempt, so the policy never sees it.)
impl<E: AsStdError> AsStdError for tower_backoff_core::Error<E> {
    fn as_std_error(&self) -> &(dyn Error + 'static) {
        match self.inner_or_layer() {
            Ok(error) => error.as_std_error(),
            Err(own) => own,
        }
    }
}

macro_rules! as_itself {
    ($($ty:ty),* $(,)?) => {$(
        impl AsStdError for $ty {
            fn as_std_error(&self) -> &(dyn Error + 'static) {
                self
            }
        }
    )*};
}

#[cfg(feature = "hyper")]
as_itself!(hyper::Error, hyper_util::client::legacy::Error);

as_itself!(
    io::Error,
    ::http::Error,
    tower::timeout::error::Elapsed,
    tokio::time::error::Elapsed,
    std::convert::Infallible,
);

#[cfg(feature = "reqwest")]
as_itself!(reqwest::Error);

#[cfg(feature = "http2")]
as_itself!(h2::Error);

// tonic's errors, for the gRPC policy, which reads them as the HTTP one does.
#[cfg(feature = "tonic")]
as_itself!(tonic::transport::Error, tonic::Status);

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    /// An error that wraps another, as clients and middleware do.
    #[derive(Debug)]
    struct Wrapped(Box<dyn Error + Send + Sync>);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    fn io(kind: io::ErrorKind) -> Box<dyn Error + Send + Sync> {
        io::Error::from(kind).into()
    }

    #[test]
    fn connection_io_errors_are_transient_at_any_depth() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionAborted,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
        ] {
            let deep = Wrapped(Box::new(Wrapped(io(kind))));
            assert_eq!(classify_error(&deep), Some(Cause::Transient), "{kind:?}");
        }
    }

    #[test]
    fn a_refused_connection_at_any_depth_is_unsent() {
        let deep = Wrapped(Box::new(Wrapped(io(io::ErrorKind::ConnectionRefused))));
        assert!(is_unsent(&deep));
        let wrapped = io::Error::other(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(is_unsent(&wrapped));
    }

    #[test]
    fn a_connection_lost_after_it_was_made_is_not_unsent() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::ConnectionAborted,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::TimedOut,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(!is_unsent(&Wrapped(io(kind))), "{kind:?}");
        }
        assert!(!is_unsent(&Endless));
    }

    #[test]
    fn io_timeouts_are_timeouts() {
        let error = Wrapped(io(io::ErrorKind::TimedOut));
        assert_eq!(classify_error(&error), Some(Cause::Timeout));
    }

    #[test]
    fn other_io_errors_are_final() {
        for kind in [
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidData,
            io::ErrorKind::Other,
        ] {
            assert_eq!(classify_error(&Wrapped(io(kind))), None, "{kind:?}");
        }
    }

    #[test]
    fn tower_elapsed_is_a_timeout_inside_a_box() {
        let boxed: Box<dyn Error + Send + Sync> = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(classify_error(boxed.as_std_error()), Some(Cause::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_elapsed_is_a_timeout() {
        let elapsed = tokio::time::timeout(
            std::time::Duration::from_millis(1),
            std::future::pending::<()>(),
        )
        .await
        .unwrap_err();
        assert_eq!(classify_error(&elapsed), Some(Cause::Timeout));
    }

    /// A real `tower::timeout` error, as an I/O adapter wraps it.
    async fn tower_elapsed_in_an_io_error() -> io::Error {
        use tower::{Service, ServiceExt};
        let mut hung = tower::timeout::Timeout::new(
            tower::service_fn(|()| std::future::pending::<Result<(), io::Error>>()),
            std::time::Duration::from_millis(1),
        );
        let error = hung.ready().await.unwrap().call(()).await.unwrap_err();
        io::Error::other(error)
    }

    #[tokio::test(start_paused = true)]
    async fn tower_elapsed_wrapped_in_an_io_error_is_a_timeout() {
        let error = tower_elapsed_in_an_io_error().await;
        assert_eq!(error.kind(), io::ErrorKind::Other);
        assert!(error.source().is_none(), "std skips the wrapped error");
        assert_eq!(classify_error(&error), Some(Cause::Timeout));
        let deeper = Wrapped(Box::new(Wrapped(Box::new(error))));
        assert_eq!(classify_error(&deeper), Some(Cause::Timeout));
    }

    #[test]
    fn a_reset_wrapped_in_an_io_error_of_another_kind_is_transient() {
        let error = io::Error::new(
            io::ErrorKind::InvalidData,
            io::Error::from(io::ErrorKind::ConnectionReset),
        );
        assert_eq!(classify_error(&error), Some(Cause::Transient));
    }

    #[test]
    fn an_io_error_wrapping_a_final_error_is_still_followed_to_its_sources() {
        // io::Error(Other) → Wrapped → ConnectionAborted: found two links down.
        let error = io::Error::other(Wrapped(io(io::ErrorKind::ConnectionAborted)));
        assert_eq!(classify_error(&error), Some(Cause::Transient));
        let plain = io::Error::other("a message, not an error type");
        assert_eq!(classify_error(&plain), None);
    }

    #[test]
    fn an_error_without_sources_is_final() {
        let error: Box<dyn Error + Send + Sync> = "plain".into();
        assert_eq!(classify_error(error.as_std_error()), None);
    }

    /// An error whose chain never ends.
    #[derive(Debug)]
    struct Endless;

    impl fmt::Display for Endless {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("endless")
        }
    }

    impl Error for Endless {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&Endless)
        }
    }

    #[test]
    fn an_endless_source_chain_is_walked_a_bounded_depth() {
        assert_eq!(classify_error(&Endless), None);
    }

    /// Only a bare reason (`h2::Error::from(Reason)`) can be built outside
    /// h2: the errors of a server's resets and GOAWAYs, and of those this
    /// side's h2 sends, are met over real connections in `tests/http2.rs`
    /// and `tests/http_hostile.rs`.
    #[cfg(feature = "http2")]
    mod http2 {
        use super::*;
        use h2::Reason;

        fn h2(reason: Reason) -> Box<dyn Error + Send + Sync> {
            Box::new(h2::Error::from(reason))
        }

        #[test]
        fn a_refused_stream_is_transient_at_any_depth() {
            let deep = Wrapped(Box::new(Wrapped(h2(Reason::REFUSED_STREAM))));
            assert_eq!(classify_error(&deep), Some(Cause::Transient));
            let in_io = io::Error::other(h2::Error::from(Reason::REFUSED_STREAM));
            assert_eq!(classify_error(&in_io), Some(Cause::Transient));
        }

        #[test]
        fn a_refused_stream_proves_nothing_unless_the_server_reset_it() {
            let bare = Wrapped(h2(Reason::REFUSED_STREAM));
            assert!(!is_unsent(&bare));
        }

        #[test]
        fn other_resets_are_transient_but_not_unsent() {
            for reason in [
                Reason::NO_ERROR,
                Reason::PROTOCOL_ERROR,
                Reason::INTERNAL_ERROR,
                Reason::FLOW_CONTROL_ERROR,
                Reason::STREAM_CLOSED,
                Reason::CANCEL,
                Reason::CONNECT_ERROR,
                Reason::from(0xbad),
            ] {
                let error = Wrapped(h2(reason));
                assert_eq!(classify_error(&error), Some(Cause::Transient), "{reason:?}");
                assert!(!is_unsent(&error), "{reason:?}");
            }
        }

        #[test]
        fn enhance_your_calm_is_throttled() {
            let error = Wrapped(h2(Reason::ENHANCE_YOUR_CALM));
            assert_eq!(classify_error(&error), Some(Cause::Throttled));
        }

        #[test]
        fn a_server_asking_for_http1_or_better_tls_is_final() {
            for reason in [Reason::HTTP_1_1_REQUIRED, Reason::INADEQUATE_SECURITY] {
                let error = Wrapped(h2(reason));
                assert_eq!(classify_error(&error), None, "{reason:?}");
                assert!(!is_unsent(&error), "{reason:?}");
            }
        }

        #[test]
        fn an_h2_error_reads_as_itself() {
            let error = h2::Error::from(Reason::CANCEL);
            assert_eq!(classify_error(error.as_std_error()), Some(Cause::Transient));
        }
    }
}
