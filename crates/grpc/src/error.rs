//! What a transport error means for a gRPC call: the status gRPC would give
//! it, or that the call never left the client.

use std::error::Error;

use tonic::Code;

use tower_backoff_http::{classify_error, find_in_chain, is_unsent};

/// What an error from the transport (no response at all) means for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportFailure {
    /// The call provably never reached the server: the connection could not
    /// be made, the request never left the client's queue, or the server
    /// refused the HTTP/2 stream (`REFUSED_STREAM`, or a `GOAWAY` whose
    /// last stream came before it) before reading it. gRFC A6 retries these
    /// transparently, whatever the retry policy says.
    NotSent,
    /// The call may have reached the server; gRPC reports it with this
    /// status, which the retry policy's codes decide on like a server's.
    Status(Code),
}

/// Classifies a transport error the way gRPC clients report it, walking the
/// error's `source()` chain:
///
/// - a failed connect (`tonic::ConnectError`, a refused TCP connection), a
///   request hyper gave back unsent (`is_canceled()`), an HTTP/2 stream
///   reset with `REFUSED_STREAM`, or a server's `GOAWAY` that the stream
///   came after: [`TransportFailure::NotSent`];
/// - any other HTTP/2 stream reset: the status gRPC's HTTP/2 protocol
///   gives its code (`CANCEL` is `CANCELLED`, `ENHANCE_YOUR_CALM` is
///   `RESOURCE_EXHAUSTED`, `INADEQUATE_SECURITY` is `PERMISSION_DENIED`,
///   the other codes it names `INTERNAL`, codes it does not name
///   `UNKNOWN`), as tonic reports it to the caller;
/// - a `tonic::Status` anywhere in the chain: its code;
/// - the call's own deadline (`tower::timeout`'s `Elapsed`, tokio's
///   `Elapsed`, tonic's `TimeoutExpired`, the layer's `TimedOut`):
///   `DEADLINE_EXCEEDED`;
/// - a failed connection (reset, broken pipe, a connection-level HTTP/2
///   error, a keep-alive ping or I/O timeout): `UNAVAILABLE`, as gRPC reports
///   a transport failure;
/// - anything else: `UNKNOWN`.
///
/// Every gRPC call is a POST, so only a call that never left is retried
/// whatever the codes: a stream reset after the server took it (a handler
/// that panicked, `CANCEL`; a server's `INTERNAL_ERROR`) may have run, and is
/// retried only when its status is one the policy retries.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::io;
/// use tonic::Code;
/// use tower_backoff::grpc::{classify_transport_error, TransportFailure};
///
/// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
/// assert_eq!(classify_transport_error(&refused), TransportFailure::NotSent);
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert_eq!(classify_transport_error(&reset), TransportFailure::Status(Code::Unavailable));
/// ```
pub fn classify_transport_error(error: &(dyn Error + 'static)) -> TransportFailure {
    // `find_in_chain` looks inside an `io::Error` at the error it wraps (a
    // refused stream or a `Status` behind an I/O adapter), which `source()`
    // alone skips.
    if let Some(found) = find_in_chain(error, classify_link) {
        return found;
    }
    if is_unsent(error) {
        return TransportFailure::NotSent;
    }
    match classify_error(error) {
        // Not the call's deadline (that was found above): a keep-alive ping
        // or the socket timed out, a connection failure to gRPC.
        Some(_) => TransportFailure::Status(Code::Unavailable),
        None => TransportFailure::Status(Code::Unknown),
    }
}

/// What one error of a chain says, if it says anything gRPC-specific.
fn classify_link(error: &(dyn Error + 'static)) -> Option<TransportFailure> {
    if error.is::<tonic::ConnectError>() {
        return Some(TransportFailure::NotSent);
    }
    if let Some(error) = error.downcast_ref::<h2::Error>() {
        return Some(classify_h2(error));
    }
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        return Some(TransportFailure::Status(status.code()));
    }
    if error.is::<tonic::TimeoutExpired>()
        || error.is::<tower::timeout::error::Elapsed>()
        || error.is::<tokio::time::error::Elapsed>()
        || error.is::<tower_backoff_core::error::TimedOut>()
    {
        return Some(TransportFailure::Status(Code::DeadlineExceeded));
    }
    None
}

/// What an HTTP/2 error means for the stream it ended.
fn classify_h2(error: &h2::Error) -> TransportFailure {
    if error.is_go_away() {
        // h2 hands a server's GOAWAY only to the streams after its last
        // stream id, and to those opened after it: streams the server never
        // processed (RFC 9113, 6.8). A GOAWAY this side sent ends a failed
        // connection, whose calls may have run.
        return if error.is_remote() {
            TransportFailure::NotSent
        } else {
            TransportFailure::Status(Code::Unavailable)
        };
    }
    if error.is_io() {
        return TransportFailure::Status(Code::Unavailable);
    }
    match error.reason() {
        Some(h2::Reason::REFUSED_STREAM) => TransportFailure::NotSent,
        Some(reason) => TransportFailure::Status(code_of_reset(reason)),
        // h2 refused to do what it was asked (a user error): nothing gRPC
        // names.
        None => TransportFailure::Status(Code::Unknown),
    }
}

/// The status of a stream reset with `reason`: the table of gRPC's
/// "PROTOCOL-HTTP2.md", Errors, which grpc-go, grpc-java and tonic follow.
fn code_of_reset(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::NO_ERROR
        | h2::Reason::PROTOCOL_ERROR
        | h2::Reason::INTERNAL_ERROR
        | h2::Reason::FLOW_CONTROL_ERROR
        | h2::Reason::SETTINGS_TIMEOUT
        | h2::Reason::FRAME_SIZE_ERROR
        | h2::Reason::COMPRESSION_ERROR
        | h2::Reason::CONNECT_ERROR => Code::Internal,
        // No processing occurred; `classify_h2` reports it as never sent.
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        // STREAM_CLOSED, HTTP_1_1_REQUIRED and codes HTTP/2 does not define:
        // the table maps none of them; tonic reports them as UNKNOWN.
        _ => Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;
    use std::io;

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

    #[test]
    fn a_refused_stream_never_left() {
        let refused = Wrapped(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
        assert_eq!(
            classify_transport_error(&refused),
            TransportFailure::NotSent
        );
    }

    /// Issue 44: every RST_STREAM code but `REFUSED_STREAM` was
    /// `UNAVAILABLE`, so a stream a handler reset after running was retried
    /// by the default codes.
    #[test]
    fn every_reset_code_gets_the_status_grpc_gives_it() {
        use h2::Reason;
        let table = [
            (Reason::NO_ERROR, Code::Internal),
            (Reason::PROTOCOL_ERROR, Code::Internal),
            (Reason::INTERNAL_ERROR, Code::Internal),
            (Reason::FLOW_CONTROL_ERROR, Code::Internal),
            (Reason::SETTINGS_TIMEOUT, Code::Internal),
            (Reason::FRAME_SIZE_ERROR, Code::Internal),
            (Reason::CANCEL, Code::Cancelled),
            (Reason::COMPRESSION_ERROR, Code::Internal),
            (Reason::CONNECT_ERROR, Code::Internal),
            (Reason::ENHANCE_YOUR_CALM, Code::ResourceExhausted),
            (Reason::INADEQUATE_SECURITY, Code::PermissionDenied),
            // Not in gRPC's table: what tonic reports.
            (Reason::STREAM_CLOSED, Code::Unknown),
            (Reason::HTTP_1_1_REQUIRED, Code::Unknown),
            (Reason::from(0xff), Code::Unknown),
        ];
        for (reason, code) in table {
            // As tonic's channel gives it: inside hyper's error, inside
            // tonic's transport error.
            let error = Wrapped(Box::new(Wrapped(Box::new(h2::Error::from(reason)))));
            assert_eq!(
                classify_transport_error(&error),
                TransportFailure::Status(code),
                "RST_STREAM({reason:?})"
            );
        }
    }

    #[test]
    fn a_failed_connect_never_left() {
        let error = Wrapped(Box::new(tonic::ConnectError(Box::new(io::Error::other(
            "dns",
        )))));
        assert_eq!(classify_transport_error(&error), TransportFailure::NotSent);
    }

    #[test]
    fn timeouts_are_deadline_exceeded_and_strangers_unknown() {
        let elapsed = Wrapped(Box::new(tower::timeout::error::Elapsed::new()));
        assert_eq!(
            classify_transport_error(&elapsed),
            TransportFailure::Status(Code::DeadlineExceeded)
        );
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(
            classify_transport_error(&denied),
            TransportFailure::Status(Code::Unknown)
        );
    }

    /// The socket or a keep-alive ping timing out is a failed connection,
    /// not the call's deadline (gRPC's PROTOCOL-HTTP2.md, PING frame).
    #[test]
    fn a_transport_timeout_is_unavailable() {
        let socket = Wrapped(Box::new(io::Error::from(io::ErrorKind::TimedOut)));
        assert_eq!(
            classify_transport_error(&socket),
            TransportFailure::Status(Code::Unavailable)
        );
    }

    #[test]
    fn a_status_in_the_chain_keeps_its_code() {
        let error = Wrapped(Box::new(tonic::Status::resource_exhausted("slow down")));
        assert_eq!(
            classify_transport_error(&error),
            TransportFailure::Status(Code::ResourceExhausted)
        );
    }

    /// Defect 4 of issue 28: `io::Error::source()` skips the error it wraps;
    /// the classifier must look at that error itself.
    #[test]
    fn a_refused_stream_or_a_status_inside_an_io_error_is_seen() {
        let refused = io::Error::other(h2::Error::from(h2::Reason::REFUSED_STREAM));
        assert_eq!(
            classify_transport_error(&refused),
            TransportFailure::NotSent
        );
        let unavailable = io::Error::other(tonic::Status::unavailable("draining"));
        assert_eq!(
            classify_transport_error(&unavailable),
            TransportFailure::Status(Code::Unavailable)
        );
        // Deeper: an io::Error inside a wrapper inside an io::Error.
        let deep = io::Error::other(Wrapped(Box::new(io::Error::other(tonic::Status::aborted(
            "conflict",
        )))));
        assert_eq!(
            classify_transport_error(&deep),
            TransportFailure::Status(Code::Aborted)
        );
    }
}
