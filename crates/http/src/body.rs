//! [`CloneBody`]: request bodies the HTTP policy can send again.

use tower_backoff_core::policy::Decision;

/// A request body that can be copied for another attempt.
///
/// Every `Clone` body is one: `Full<Bytes>`, `Empty<Bytes>`, `Bytes`,
/// `String`, `()` in tests. A streaming body is one once wrapped in a
/// [`ReplayBody`](super::ReplayBody), which records what was sent, up to a
/// limit.
pub trait CloneBody: Sized {
    /// A copy to send with the next attempt, or `None` when there can be none
    /// (the body is larger than what may be recorded). A request whose body
    /// cannot be copied goes out once, and its outcome is returned untouched.
    fn clone_body(&self) -> Option<Self>;

    /// Whether a copy made earlier can still be sent in full. A body that
    /// started recording but outgrew its limit, or whose source failed, says
    /// no, and the outcome of the attempt that used it is returned as is.
    fn is_replayable(&self) -> bool {
        true
    }

    /// This copy goes out while an earlier one may still be sending (a
    /// [hedge](tower_backoff_core::hedge)), not after it failed (a retry): a
    /// body that replays one source must let both finish rather than end the
    /// earlier one. The default does nothing: a `Clone` body is no shared
    /// source.
    fn mark_concurrent(&mut self) {}
}

impl<B: Clone> CloneBody for B {
    fn clone_body(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Another attempt's request: the same method, URI, version, headers and
/// extensions, with a copy of the body; `None` when the body has none. What
/// the HTTP and gRPC policies' `clone_request` do, for a policy of your own.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// let request = http::Request::put("http://example.test/item").body(String::from("x")).unwrap();
/// let copy = tower_backoff::http::parts::copy_request(&request).unwrap();
/// assert_eq!((copy.method(), copy.body()), (request.method(), request.body()));
/// ```
pub fn copy_request<B: CloneBody>(request: &http::Request<B>) -> Option<http::Request<B>> {
    let mut copy = http::Request::new(request.body().clone_body()?);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

/// `decision`, unless it retries a request whose body can no longer be sent
/// whole: the copy shares its recording with the body just sent, and if that
/// outgrew its limit (for gRPC: the call is committed, gRFC A6) the outcome
/// stands. What the HTTP and gRPC policies do after classifying, for a
/// policy of your own.
pub fn unless_spent<B: CloneBody>(decision: Decision, body: &B) -> Decision {
    if decision.is_retry() && !body.is_replayable() {
        return Decision::Final;
    }
    decision
}
