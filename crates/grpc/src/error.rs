//! What a transport error means for a gRPC call: the status gRPC would give
//! it, or that the call never left the client.

use std::error::Error;
use std::io;

use tonic::Code;

use tower_backoff_core::policy::Cause;
use tower_backoff_http::{classify_error, find_in_chain};

/// What an error from the transport (no response at all) means for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// The call provably never reached the server: the connection could not
    /// be made, or the server refused the HTTP/2 stream (`REFUSED_STREAM`)
    /// before reading it. gRFC A6 retries these transparently, whatever the
    /// retry policy says.
    NotSent,
    /// The call may have reached the server; gRPC reports it with this
    /// status, which the retry policy's codes decide on like a server's.
    Status(Code),
}

/// Classifies a transport error the way gRPC clients report it, walking the
/// error's `source()` chain:
///
/// - a failed connect (`tonic::ConnectError`, a refused TCP connection), or an
///   HTTP/2 stream reset with `REFUSED_STREAM`: [`TransportFailure::NotSent`];
/// - a `tonic::Status` anywhere in the chain: its code;
/// - a timeout (`tower::timeout`'s `Elapsed`, tonic's `TimeoutExpired`):
///   `DEADLINE_EXCEEDED`;
/// - a dropped connection (reset, broken pipe, an HTTP/2 error, hyper's
///   "connection closed before message completed"): `UNAVAILABLE`, as gRPC
///   reports a transport failure;
/// - anything else: `UNKNOWN`.
///
/// ```
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
    let mut seen_h2 = false;
    // `find_in_chain` looks inside an `io::Error` at the error it wraps (a
    // refused stream or a `Status` behind an I/O adapter), which `source()`
    // alone skips.
    let found = find_in_chain(error, |error| {
        if error.is::<tonic::ConnectError>() {
            return Some(TransportFailure::NotSent);
        }
        if let Some(error) = error.downcast_ref::<h2::Error>() {
            if error.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return Some(TransportFailure::NotSent);
            }
            seen_h2 = true;
        }
        if let Some(error) = error.downcast_ref::<io::Error>() {
            if error.kind() == io::ErrorKind::ConnectionRefused {
                return Some(TransportFailure::NotSent);
            }
        }
        if let Some(status) = error.downcast_ref::<tonic::Status>() {
            return Some(TransportFailure::Status(status.code()));
        }
        if error.is::<tonic::TimeoutExpired>() {
            return Some(TransportFailure::Status(Code::DeadlineExceeded));
        }
        None
    });
    if let Some(found) = found {
        return found;
    }
    match classify_error(error) {
        Some(Cause::Timeout) => TransportFailure::Status(Code::DeadlineExceeded),
        Some(_) => TransportFailure::Status(Code::Unavailable),
        None if seen_h2 => TransportFailure::Status(Code::Unavailable),
        None => TransportFailure::Status(Code::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

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
        let cancelled = Wrapped(Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR)));
        assert_eq!(
            classify_transport_error(&cancelled),
            TransportFailure::Status(Code::Unavailable)
        );
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
