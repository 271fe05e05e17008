//! [`GrpcPolicy`]: retries gRPC calls the way gRFC A6 specifies.

use std::error::Error;
use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::{Request, Response, StatusCode};
use tonic::Code;

use super::code::CodeSet;
use super::error::{classify_transport_error, TransportFailure};
use super::pushback::{parse_pushback, Pushback};
use crate::http::{AsStdError, CloneBody, RetryInfo};
use crate::policy::{Cause, Decision, Policy};

/// The metadata key a retry carries: how many attempts went before it (gRFC
/// A6). Absent on the first attempt, `1` on the second, and so on.
pub const PREVIOUS_RPC_ATTEMPTS: HeaderName = HeaderName::from_static("grpc-previous-rpc-attempts");

/// The status a gRPC server answers with; in the headers of a trailers-only
/// response.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Longest server pushback [`GrpcPolicy`] waits for by default: one minute.
/// A server asking for more is, in effect, saying "not now": the call ends
/// with its status rather than hold the caller that long.
pub const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(60);

/// Retries gRPC calls (`http::Request<B>` / `http::Response<B>`, as tonic's
/// `Channel` sends and answers them) as gRFC A6 says a client should.
///
/// - **Which statuses**: those in the retryable set, [`CodeSet::DEFAULT`]
///   (`UNAVAILABLE`) unless told otherwise. Add codes such as `ABORTED` or
///   `RESOURCE_EXHAUSTED` only for methods that are safe to run twice: every
///   gRPC call is a POST, so the method does not gate retries, the code set
///   is the statement of what is safe.
/// - **When the status is read**: a *trailers-only* response carries its
///   status in the headers and is classified at once. A response whose
///   headers carry no status is **committed**: the server has started to
///   answer, so it is returned and never retried, whatever its trailers say
///   later. Server-streaming calls are safe for that reason. A non-200 HTTP
///   response without a status (from a proxy) gets the status gRPC maps it to
///   (429, 502, 503, 504 are `UNAVAILABLE`).
/// - **Pushback**: `grpc-retry-pushback-ms` ([`parse_pushback`](super::parse_pushback)) with a
///   non-negative value is the delay before the retry, exactly; a negative,
///   malformed or repeated value means "do not retry". A value longer than
///   [`max_pushback`](Self::max_pushback) ends the call too, so a hostile
///   server cannot park a caller for 24 days.
/// - **Transport errors** get the status gRPC gives them
///   ([`classify_transport_error`]): a dropped connection is `UNAVAILABLE`
///   and retried by default. A call that provably never left the client (the
///   connection failed, the server refused the stream) is retried once at
///   once, without counting against the attempt limit or the budget, whatever
///   the codes ([`Cause::NotSent`], A6's *transparent retry*).
/// - **Retries are marked**: each carries `grpc-previous-rpc-attempts`.
/// - **Request bodies**: tonic's body is a stream, not `Clone`; wrap it in a
///   [`ReplayBody`](crate::http::ReplayBody) ([`ReplayLayer`](super::ReplayLayer)).
///   Once a call's messages outgrow the replay limit, it is committed: its
///   outcome is returned as is.
///
/// Causes: `UNAVAILABLE` and `RESOURCE_EXHAUSTED` from the server are
/// [`Cause::Throttled`], `DEADLINE_EXCEEDED` is [`Cause::Timeout`], the rest
/// [`Cause::Transient`]. Responses returned carry a [`RetryInfo`] in their
/// extensions.
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_backoff::grpc::GrpcPolicy;
/// use tower_backoff::{BackoffLayer, Decision};
///
/// let policy = GrpcPolicy::new().retry_code(Code::ResourceExhausted);
/// let trailers_only = |status: &str| {
///     let mut headers = http::HeaderMap::new();
///     headers.insert("grpc-status", status.parse().unwrap());
///     headers
/// };
/// assert!(policy.classify_response(http::StatusCode::OK, &trailers_only("14")).is_retry());
/// assert_eq!(policy.classify_response(http::StatusCode::OK, &trailers_only("3")), Decision::Fail);
/// // Headers without a status: the call is committed.
/// assert_eq!(policy.classify_response(http::StatusCode::OK, &http::HeaderMap::new()), Decision::Success);
///
/// let layer = BackoffLayer::builder().policy(policy).build()?;
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct GrpcPolicy {
    codes: CodeSet,
    max_pushback: Duration,
    record_info: bool,
}

impl GrpcPolicy {
    /// Retries `UNAVAILABLE`, honours pushback up to [`DEFAULT_MAX_PUSHBACK`].
    pub const fn new() -> Self {
        Self {
            codes: CodeSet::DEFAULT,
            max_pushback: DEFAULT_MAX_PUSHBACK,
            record_info: true,
        }
    }

    /// Also retries `code`.
    pub const fn retry_code(mut self, code: Code) -> Self {
        self.codes = self.codes.with(code);
        self
    }

    /// Retries exactly `codes` (a service config's `retryableStatusCodes`).
    /// [`CodeSet::EMPTY`] leaves only the transparent retry of calls that
    /// never left.
    pub const fn codes(mut self, codes: CodeSet) -> Self {
        self.codes = codes;
        self
    }

    /// The codes retried.
    pub const fn retryable_codes(&self) -> CodeSet {
        self.codes
    }

    /// Longest `grpc-retry-pushback-ms` waited for (default
    /// [`DEFAULT_MAX_PUSHBACK`]); a longer one ends the call with its status,
    /// as a negative one does.
    pub const fn max_pushback(mut self, max: Duration) -> Self {
        self.max_pushback = max;
        self
    }

    /// Stops adding [`RetryInfo`] to responses (it costs one small
    /// allocation per call).
    pub const fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// What a response with this HTTP status and these headers means.
    pub fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        let code = match headers.get(GRPC_STATUS) {
            Some(value) => Code::from_bytes(value.as_bytes()),
            // Headers without a status: the server started answering, and
            // the call is committed (A6).
            None if status == StatusCode::OK => return Decision::Success,
            None => code_of_http_status(status),
        };
        if code == Code::Ok {
            return Decision::Success;
        }
        if !self.codes.contains(code) {
            return Decision::Fail;
        }
        let cause = match code {
            Code::Unavailable | Code::ResourceExhausted => Cause::Throttled,
            Code::DeadlineExceeded => Cause::Timeout,
            _ => Cause::Transient,
        };
        match parse_pushback(headers) {
            Pushback::Absent => Decision::retry().because(cause),
            Pushback::After(delay) if delay <= self.max_pushback => {
                Decision::retry_after(delay).because(cause)
            }
            Pushback::After(_) | Pushback::Stop => Decision::Fail,
        }
    }

    /// What an error with no response means.
    pub fn classify_error(&self, error: &(dyn Error + 'static)) -> Decision {
        match classify_transport_error(error) {
            TransportFailure::NotSent => Decision::retry().because(Cause::NotSent),
            TransportFailure::Status(code) if self.codes.contains(code) => {
                let cause = if code == Code::DeadlineExceeded {
                    Cause::Timeout
                } else {
                    Cause::Transient
                };
                Decision::retry().because(cause)
            }
            TransportFailure::Status(_) => Decision::Fail,
        }
    }
}

impl Default for GrpcPolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// The status gRPC gives a response with no `grpc-status` and a non-200 HTTP
/// status (gRPC's "HTTP to gRPC status code mapping").
fn code_of_http_status(status: StatusCode) -> Code {
    match status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    }
}

impl<ReqBody, ResBody, E> Policy<Request<ReqBody>, Response<ResBody>, E> for GrpcPolicy
where
    ReqBody: CloneBody,
    E: AsStdError,
{
    fn classify(
        &self,
        request: &Request<ReqBody>,
        result: &Result<Response<ResBody>, E>,
    ) -> Decision {
        let decision = match result {
            Ok(response) => self.classify_response(response.status(), response.headers()),
            Err(error) => self.classify_error(error.as_std_error()),
        };
        // Past the replay limit the call is committed (A6): nothing whole
        // is left to send again.
        if decision.is_retry() && !request.body().is_replayable() {
            return Decision::Fail;
        }
        decision
    }

    fn clone_request(&self, request: &Request<ReqBody>) -> Option<Request<ReqBody>> {
        let mut copy = Request::new(request.body().clone_body()?);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }

    fn prepare_retry(&self, request: &mut Request<ReqBody>, attempt: u32) {
        request.headers_mut().insert(
            PREVIOUS_RPC_ATTEMPTS,
            HeaderValue::from(attempt.saturating_sub(1)),
        );
    }

    fn finish(&self, result: &mut Result<Response<ResBody>, E>, attempts: u32, slept: Duration) {
        if let (Ok(response), true) = (result, self.record_info) {
            response
                .extensions_mut()
                .insert(RetryInfo::new(attempts, slept));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ReplayBody;

    fn trailers_only(status: &str, pushback: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_STATUS, status.parse().unwrap());
        if let Some(value) = pushback {
            headers.insert("grpc-retry-pushback-ms", value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn only_unavailable_is_retried_by_default() {
        let policy = GrpcPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("14", None)),
            Decision::retry().because(Cause::Throttled)
        );
        for code in ["1", "2", "3", "4", "8", "10", "13", "16"] {
            assert_eq!(
                policy.classify_response(StatusCode::OK, &trailers_only(code, None)),
                Decision::Fail,
                "{code}"
            );
        }
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("0", None)),
            Decision::Success
        );
    }

    #[test]
    fn a_garbled_status_is_unknown_and_not_retried() {
        let policy = GrpcPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("14x", None)),
            Decision::Fail
        );
        let unknown = GrpcPolicy::new().retry_code(Code::Unknown);
        assert!(unknown
            .classify_response(StatusCode::OK, &trailers_only("99999999999", None))
            .is_retry());
    }

    #[test]
    fn headers_without_a_status_commit_the_call() {
        let policy = GrpcPolicy::new().codes(CodeSet::EMPTY.with(Code::Unknown));
        assert_eq!(
            policy.classify_response(StatusCode::OK, &HeaderMap::new()),
            Decision::Success
        );
    }

    #[test]
    fn a_proxy_503_without_a_status_is_unavailable() {
        let policy = GrpcPolicy::new();
        assert!(policy
            .classify_response(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new())
            .is_retry());
        assert_eq!(
            policy.classify_response(StatusCode::NOT_FOUND, &HeaderMap::new()),
            Decision::Fail
        );
    }

    #[test]
    fn pushback_is_the_delay_or_a_stop() {
        let policy = GrpcPolicy::new().max_pushback(Duration::from_secs(10));
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("14", Some("1500"))),
            Decision::retry_after(Duration::from_millis(1500)).because(Cause::Throttled)
        );
        for stop in ["-1", "abc", "10001", "2147483647", "9999999999999"] {
            assert_eq!(
                policy.classify_response(StatusCode::OK, &trailers_only("14", Some(stop))),
                Decision::Fail,
                "{stop}"
            );
        }
    }

    #[test]
    fn pushback_never_makes_a_final_code_retryable() {
        let policy = GrpcPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("3", Some("10"))),
            Decision::Fail
        );
    }

    #[test]
    fn retries_carry_the_number_of_previous_attempts() {
        let policy = GrpcPolicy::new();
        let mut request = Request::new(String::new());
        Policy::<_, Response<()>, std::io::Error>::prepare_retry(&policy, &mut request, 2);
        assert_eq!(request.headers()[PREVIOUS_RPC_ATTEMPTS], "1");
        Policy::<_, Response<()>, std::io::Error>::prepare_retry(&policy, &mut request, 4);
        assert_eq!(request.headers()[PREVIOUS_RPC_ATTEMPTS], "3");
    }

    #[test]
    fn a_post_is_copied_with_everything_but_the_attempt_mark() {
        let policy = GrpcPolicy::new();
        let request = Request::post("http://example.com/pkg.Svc/Call")
            .header("te", "trailers")
            .body(ReplayBody::new(http_body_util::Full::new(
                bytes::Bytes::from("msg"),
            )))
            .unwrap();
        let copy = Policy::<_, Response<()>, std::io::Error>::clone_request(&policy, &request)
            .expect("a POST with a replayable body is copied");
        assert_eq!(copy.method(), ::http::Method::POST);
        assert_eq!(copy.uri(), request.uri());
        assert_eq!(copy.headers()["te"], "trailers");
        assert!(!copy.headers().contains_key(PREVIOUS_RPC_ATTEMPTS));
    }
}
