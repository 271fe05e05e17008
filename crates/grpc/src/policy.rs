//! [`GrpcPolicy`]: retries gRPC calls the way gRFC A6 specifies.

use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tonic::Code;

use super::code::CodeSet;
use super::error::{classify_transport_error, TransportFailure};
use super::pushback::{parse_pushback, Pushback};
use super::throttle::RetryThrottle;
use super::timeout::CallDeadline;
use tower_backoff_core::policy::{Cause, Decision, Policy, PrepareRetry};
use tower_backoff_http::{AsStdError, CloneBody};

/// The metadata key a retry carries: how many attempts went before it (gRFC
/// A6). Absent on the first attempt, `1` on the second, and so on.
#[doc(hidden)]
pub const PREVIOUS_RPC_ATTEMPTS: HeaderName = HeaderName::from_static("grpc-previous-rpc-attempts");

/// The status a gRPC server answers with; in the headers of a trailers-only
/// response.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Longest server pushback [`GrpcPolicy`] waits for by default: one minute.
/// A server asking for more is, in effect, saying "not now": the call ends
/// with its status rather than hold the caller that long.
#[doc(hidden)]
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
///   server cannot park a caller for 24 days; unless the call has a
///   deadline of its own (`grpc-timeout`, behind a
///   [`GrpcRetryLayer`](crate::GrpcRetryLayer)): then the deadline bounds
///   it, as in gRPC's clients: a pushback that ends before it is waited,
///   one that ends past it ends the call at once with its status.
/// - **The call's deadline** (behind a
///   [`GrpcRetryLayer`](crate::GrpcRetryLayer)): each retry and hedge
///   carries the time left in its `grpc-timeout`, and no outcome is
///   retried once the deadline has passed (a `DEADLINE_EXCEEDED` least of
///   all).
/// - **Transport errors** get the status gRPC gives them
///   ([`classify_transport_error`]): a dropped connection is `UNAVAILABLE`
///   and retried by default; a stream the server reset gets its code's
///   status (`CANCEL`, as when a handler panicked, is `CANCELLED`;
///   `INTERNAL_ERROR` is `INTERNAL`), retried only when that status is. A
///   call that provably never left the client (the connection failed, the
///   server refused the stream or sent a `GOAWAY` before it) is retried
///   once at once, without counting against the attempt limit or the
///   budget, whatever the codes ([`Cause::NotSent`], A6's *transparent
///   retry*). Behind a [`GrpcRetryLayer`](crate::GrpcRetryLayer), once that
///   retry is spent a call that never left again is the `UNAVAILABLE` it
///   amounts to, for the codes and `maxAttempts` to decide.
/// - **Retries and hedges are marked**: each carries
///   `grpc-previous-rpc-attempts`, the number of attempts sent before it.
/// - **Hedges** (a layer built with
///   [`hedge`](tower_backoff_core::BackoffBuilder::hedge), as a service
///   config's `hedgingPolicy` makes [`GrpcRetryLayer`](crate::GrpcRetryLayer)
///   do): the retryable codes are the non-fatal ones; with a
///   [`throttle`](Self::throttle), no hedge goes out while it refuses
///   retries.
/// - **Request bodies**: tonic's body is a stream, not `Clone`; wrap it in a
///   [`ReplayBody`](tower_backoff_http::ReplayBody) ([`ReplayLayer`](super::ReplayLayer)).
///   Once a call's messages outgrow the replay limit, it is committed: its
///   outcome is returned as is.
///
/// Causes: `UNAVAILABLE` and `RESOURCE_EXHAUSTED` from the server are
/// [`Cause::Throttled`], `DEADLINE_EXCEEDED` is [`Cause::Timeout`], the rest
/// [`Cause::Transient`]. Behind a [`GrpcRetryLayer`](crate::GrpcRetryLayer),
/// responses returned carry a [`RetryInfo`](tower_backoff_http::RetryInfo) in their extensions.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
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
/// assert_eq!(policy.classify_response(http::StatusCode::OK, &trailers_only("3")), Decision::Final);
/// // Headers without a status: the call is committed.
/// assert_eq!(policy.classify_response(http::StatusCode::OK, &http::HeaderMap::new()), Decision::Success);
///
/// let layer = BackoffLayer::builder().policy(policy).build()?;
/// # drop(layer);
/// # Ok::<_, tower_backoff::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct GrpcPolicy {
    codes: CodeSet,
    max_pushback: Duration,
    throttle: Option<Arc<RetryThrottle>>,
    /// A hedged method's policy: a failure the throttle counts stays a
    /// failure of that copy, so the copies still pending run on (A6); the
    /// layer's budget then refuses what follows.
    hedging: bool,
    /// A committed call is counted by its trailers
    /// ([`GrpcBody`](crate::GrpcBody), behind a
    /// [`GrpcRetryLayer`](crate::GrpcRetryLayer)), not by its headers.
    trailers_counted: bool,
}

/// How an outcome counts for gRFC A6's retry throttling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Success,
    /// Headers without a status: how the call ends is in its trailers.
    Committed,
    /// A retryable status, or a pushback that says not to retry.
    Failure,
    /// A final status, or a call that never reached the server.
    Neither,
}

impl GrpcPolicy {
    /// Retries `UNAVAILABLE`, honours pushback up to [`DEFAULT_MAX_PUSHBACK`].
    pub const fn new() -> Self {
        Self {
            codes: CodeSet::DEFAULT,
            max_pushback: DEFAULT_MAX_PUSHBACK,
            throttle: None,
            hedging: false,
            trailers_counted: false,
        }
    }

    /// A committed call's throttle accounting is left to its trailers.
    pub(crate) fn trailers_counted(mut self) -> Self {
        self.trailers_counted = true;
        self
    }

    /// Counts a committed call's trailers for the throttle, if any: as a
    /// trailers-only answer with that status would count.
    pub(crate) fn count_trailers(&self, trailers: &HeaderMap) {
        let Some(throttle) = &self.throttle else {
            return;
        };
        match self.judge_response(StatusCode::OK, trailers, false).1 {
            Counted::Success | Counted::Committed => throttle.record_success(),
            Counted::Failure => {
                throttle.record_failure();
            }
            Counted::Neither => {}
        }
    }

    /// Whether it counts a throttle.
    pub(crate) fn has_throttle(&self) -> bool {
        self.throttle.is_some()
    }

    /// The policy of a hedged method: with a throttle, a counted failure is
    /// not turned into the call's outcome while other copies may still win;
    /// [`GrpcRetryLayer`](super::GrpcRetryLayer) gives such a method a budget
    /// that stops its further copies instead.
    pub(crate) fn for_hedging(mut self) -> Self {
        self.hedging = true;
        self
    }

    /// Also retries `code`.
    pub fn retry_code(mut self, code: Code) -> Self {
        self.codes = self.codes.with(code);
        self
    }

    /// Retries exactly `codes` (a service config's `retryableStatusCodes`).
    /// [`CodeSet::EMPTY`] leaves only the transparent retry of calls that
    /// never left.
    pub fn codes(mut self, codes: CodeSet) -> Self {
        self.codes = codes;
        self
    }

    /// The codes retried.
    pub const fn retryable_codes(&self) -> CodeSet {
        self.codes
    }

    /// Longest `grpc-retry-pushback-ms` waited for (default
    /// [`DEFAULT_MAX_PUSHBACK`]); a longer one ends the call with its status,
    /// as a negative one does. A call with a deadline of its own
    /// (`grpc-timeout`, behind a [`GrpcRetryLayer`](crate::GrpcRetryLayer))
    /// is bounded by that deadline instead.
    pub fn max_pushback(mut self, max: Duration) -> Self {
        self.max_pushback = max;
        self
    }

    /// Applies gRFC A6's retry throttling in the policy itself: every
    /// outcome it classifies is counted (a retryable status or a pushback
    /// saying not to retry takes a token, a success adds `tokenRatio`), and
    /// a failure that leaves the count at or below half is returned instead
    /// of retried. Unlike a [`RetryThrottle`] given to the layer as its
    /// budget, this sees every attempt, the last one included: it is A6's
    /// accounting exactly. Give the layer no other budget for the same
    /// throttle, or failures count twice.
    /// [`GrpcRetryLayer`](super::GrpcRetryLayer) does this with a service
    /// config's `retryThrottling`, and counts a committed call (headers
    /// without a status) by its trailers ([`GrpcBody`](crate::GrpcBody));
    /// behind a plain layer, which never sees the trailers, this policy
    /// counts such a call a success as its headers arrive.
    pub fn throttle(mut self, throttle: Arc<RetryThrottle>) -> Self {
        self.throttle = Some(throttle);
        self
    }

    /// What a response with this HTTP status and these headers means.
    pub fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        self.judge_response(status, headers, false).0
    }

    /// What an error with no response means, for a call whose transparent
    /// retry is still to come.
    pub fn classify_error(&self, error: &(dyn Error + 'static)) -> Decision {
        self.judge_error(error, false).0
    }

    /// `bounded` when the call has a deadline of its own: then it, not
    /// `max_pushback`, bounds a pushback (the engine ends the call at once
    /// if the pushback would end past it).
    fn judge_response(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        bounded: bool,
    ) -> (Decision, Counted) {
        let code = match headers.get(GRPC_STATUS) {
            Some(value) => Code::from_bytes(value.as_bytes()),
            // Headers without a status: the server started answering, and
            // the call is committed (A6).
            None if status == StatusCode::OK => return (Decision::Success, Counted::Committed),
            None => code_of_http_status(status),
        };
        if code == Code::Ok {
            return (Decision::Success, Counted::Success);
        }
        // As gRPC-Go reads A6: a pushback saying not to retry counts as a
        // failure whatever the code.
        let pushback = match parse_pushback(headers) {
            Pushback::After(delay) if delay > self.max_pushback && !bounded => Pushback::Stop,
            pushback => pushback,
        };
        if pushback == Pushback::Stop {
            return (Decision::Final, Counted::Failure);
        }
        if !self.codes.contains(code) {
            return (Decision::Final, Counted::Neither);
        }
        let cause = match code {
            Code::Unavailable | Code::ResourceExhausted => Cause::Throttled,
            Code::DeadlineExceeded => Cause::Timeout,
            _ => Cause::Transient,
        };
        let decision = match pushback {
            Pushback::After(delay) => Decision::retry_after(delay),
            _ => Decision::retry(),
        };
        (decision.because(cause), Counted::Failure)
    }

    /// What a transport error means; `transparent_spent` once the call's
    /// one transparent retry went out.
    fn judge_error(
        &self,
        error: &(dyn Error + 'static),
        transparent_spent: bool,
    ) -> (Decision, Counted) {
        match classify_transport_error(error) {
            // A6: transparent retries do not count for throttling.
            TransportFailure::NotSent if !transparent_spent => {
                (Decision::retry().because(Cause::NotSent), Counted::Neither)
            }
            // A6: one transparent retry; past it the retry policy decides,
            // as on the UNAVAILABLE a call that never left amounts to.
            TransportFailure::NotSent => self.judge_code(Code::Unavailable),
            TransportFailure::Status(code) => self.judge_code(code),
        }
    }

    /// What a transport failure with `code` means under the retry policy.
    fn judge_code(&self, code: Code) -> (Decision, Counted) {
        match code {
            code if self.codes.contains(code) => {
                let cause = if code == Code::DeadlineExceeded {
                    Cause::Timeout
                } else {
                    Cause::Transient
                };
                (Decision::retry().because(cause), Counted::Failure)
            }
            _ => (Decision::Final, Counted::Neither),
        }
    }
}

/// Whether a call's one transparent retry (A6) went out: shared by the
/// request [`GrpcRetryLayer`](crate::GrpcRetryLayer) keeps and every copy
/// of it, so that the policy, which sees the kept request, knows. A call
/// without it (the policy behind a plain `BackoffLayer`) gets the engine's
/// rule: a second call that never left is an ordinary retry.
#[derive(Debug, Clone, Default)]
pub(crate) struct TransparentRetry(Arc<AtomicBool>);

impl TransparentRetry {
    fn spend(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_spent(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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
        let spent = request
            .extensions()
            .get::<TransparentRetry>()
            .is_some_and(TransparentRetry::is_spent);
        let deadline = request.extensions().get::<CallDeadline>().copied();
        // Past the replay limit the call is committed (A6).
        tower_backoff_http::parts::unless_spent(self.judge(result, spent, deadline), request.body())
    }

    fn clone_request(&self, request: &Request<ReqBody>) -> Option<Request<ReqBody>> {
        tower_backoff_http::parts::copy_request(request)
    }

    fn prepare_retry(&self, mut retry: PrepareRetry<'_, Request<ReqBody>, Response<ResBody>, E>) {
        if retry.args().is_transparent() {
            if let Some(transparent) = retry.request().extensions().get::<TransparentRetry>() {
                transparent.spend();
            }
        }
        let previous = retry.args().attempt();
        let request = retry.request_mut();
        request
            .headers_mut()
            .insert(PREVIOUS_RPC_ATTEMPTS, HeaderValue::from(previous));
        // Each attempt carries the time left of the call's deadline.
        if let Some(deadline) = request.extensions().get::<CallDeadline>().copied() {
            deadline.stamp(request.headers_mut());
        }
    }

    fn prepare_hedge(&self, copy: &mut Request<ReqBody>, attempt: u32) -> bool {
        // A6: hedges, like retries, stop while the throttle is at half.
        if self.throttle.as_ref().is_some_and(|t| !t.allows_retry()) {
            return false;
        }
        copy.headers_mut().insert(
            PREVIOUS_RPC_ATTEMPTS,
            HeaderValue::from(attempt.saturating_sub(1)),
        );
        if let Some(deadline) = copy.extensions().get::<CallDeadline>().copied() {
            deadline.stamp(copy.headers_mut());
        }
        copy.body_mut().mark_concurrent();
        true
    }
}

impl GrpcPolicy {
    /// What an attempt's outcome means, counted by A6's throttle if on.
    /// `deadline` is the call's own (from its `grpc-timeout`), if any.
    fn judge<B, E: AsStdError>(
        &self,
        result: &Result<Response<B>, E>,
        transparent_spent: bool,
        deadline: Option<CallDeadline>,
    ) -> Decision {
        let bounded = deadline.is_some();
        let (decision, counted) = match result {
            Ok(response) => self.judge_response(response.status(), response.headers(), bounded),
            Err(error) => self.judge_error(error.as_std_error(), transparent_spent),
        };
        if let Some(throttle) = &self.throttle {
            match counted {
                Counted::Success => throttle.record_success(),
                // Without a layer to read its trailers, a committed call
                // can only count as the success its headers look like.
                Counted::Committed if !self.trailers_counted => throttle.record_success(),
                Counted::Failure if !throttle.record_failure() && !self.hedging => {
                    return Decision::Final;
                }
                Counted::Failure | Counted::Committed | Counted::Neither => {}
            }
        }
        // A call whose deadline passed is over: nothing of it is retried, a
        // DEADLINE_EXCEEDED least of all (gRPC's clients say so).
        if decision.is_retry() && deadline.is_some_and(|d| d.has_passed(Instant::now())) {
            return Decision::Final;
        }
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_backoff_core::events::{OutcomeKind, RetryArgs};
    use tower_backoff_http::ReplayBody;

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
                Decision::Final,
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
            Decision::Final
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
            Decision::Final
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
                Decision::Final,
                "{stop}"
            );
        }
    }

    #[test]
    fn pushback_never_makes_a_final_code_retryable() {
        let policy = GrpcPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("3", Some("10"))),
            Decision::Final
        );
    }

    fn classify(policy: &GrpcPolicy, headers: HeaderMap) -> Decision {
        let request = Request::new(String::new());
        let mut response = Response::new(());
        *response.headers_mut() = headers;
        Policy::<_, _, std::io::Error>::classify(policy, &request, &Ok(response))
    }

    #[test]
    fn a_throttled_policy_counts_outcomes_and_stops_at_half() {
        let throttle = Arc::new(RetryThrottle::new(4.0, 0.5).unwrap());
        let policy = GrpcPolicy::new().throttle(Arc::clone(&throttle));
        assert!(classify(&policy, trailers_only("14", None)).is_retry());
        assert_eq!(throttle.tokens(), 3.0);
        // Not counted: a final code without pushback.
        assert_eq!(classify(&policy, trailers_only("3", None)), Decision::Final);
        assert_eq!(throttle.tokens(), 3.0);
        // Counted: a pushback that says stop, on any code.
        assert_eq!(
            classify(&policy, trailers_only("3", Some("-5"))),
            Decision::Final
        );
        assert_eq!(throttle.tokens(), 2.0);
        // At half, a retryable status is returned.
        assert_eq!(
            classify(&policy, trailers_only("14", None)),
            Decision::Final
        );
        assert_eq!(throttle.tokens(), 1.0);
        assert_eq!(classify(&policy, HeaderMap::new()), Decision::Success);
        assert_eq!(throttle.tokens(), 1.5);
    }

    fn classify_by(policy: &GrpcPolicy, deadline: CallDeadline, headers: HeaderMap) -> Decision {
        let mut request = Request::new(String::new());
        request.extensions_mut().insert(deadline);
        let mut response = Response::new(());
        *response.headers_mut() = headers;
        Policy::<_, _, std::io::Error>::classify(policy, &request, &Ok(response))
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_retried_once_the_calls_deadline_has_passed() {
        let policy = GrpcPolicy::new().retry_code(Code::DeadlineExceeded);
        let deadline = CallDeadline::after(Duration::from_millis(300)).unwrap();
        let exceeded = || trailers_only("4", None);
        assert!(classify_by(&policy, deadline, exceeded()).is_retry());
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(classify_by(&policy, deadline, exceeded()), Decision::Final);
        assert_eq!(
            classify_by(&policy, deadline, trailers_only("14", Some("0"))),
            Decision::Final
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_deadline_not_max_pushback_bounds_a_pushback() {
        let policy = GrpcPolicy::new().max_pushback(Duration::from_secs(10));
        let deadline = CallDeadline::after(Duration::from_secs(3600)).unwrap();
        // Past max_pushback: waited, for the engine to hold against the
        // deadline.
        assert_eq!(
            classify_by(&policy, deadline, trailers_only("14", Some("90000"))),
            Decision::retry_after(Duration::from_secs(90)).because(Cause::Throttled)
        );
        // Without a deadline of its own, the call ends.
        assert_eq!(
            classify(&policy, trailers_only("14", Some("90000"))),
            Decision::Final
        );
        // A pushback saying not to retry still stops.
        assert_eq!(
            classify_by(&policy, deadline, trailers_only("14", Some("-1"))),
            Decision::Final
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retries_and_hedges_carry_the_time_left() {
        let policy = GrpcPolicy::new();
        let deadline = CallDeadline::after(Duration::from_millis(500)).unwrap();
        let mut request = Request::new(String::new());
        request.extensions_mut().insert(deadline);
        tokio::time::advance(Duration::from_millis(352)).await;
        let replaced: Result<Response<()>, std::io::Error> = Ok(Response::new(()));
        let args = RetryArgs::new(1, Duration::ZERO, Cause::Throttled, OutcomeKind::Response);
        Policy::prepare_retry(&policy, PrepareRetry::new(&mut request, replaced, args));
        assert_eq!(request.headers()[crate::GRPC_TIMEOUT], "148000u");
        tokio::time::advance(Duration::from_millis(100)).await;
        let mut copy = Request::new(String::new());
        copy.extensions_mut().insert(deadline);
        assert!(Policy::<_, Response<()>, std::io::Error>::prepare_hedge(
            &policy, &mut copy, 2
        ));
        assert_eq!(copy.headers()[crate::GRPC_TIMEOUT], "48000000n");
    }

    #[test]
    fn retries_carry_the_number_of_previous_attempts() {
        let policy = GrpcPolicy::new();
        let mut request = Request::new(String::new());
        // A retry after attempt number `failed`.
        let prepare = |request: &mut Request<String>, failed: u32| {
            let replaced: Result<Response<()>, std::io::Error> = Ok(Response::new(()));
            let args = RetryArgs::new(
                failed,
                Duration::ZERO,
                Cause::Throttled,
                OutcomeKind::Response,
            );
            Policy::prepare_retry(&policy, PrepareRetry::new(request, replaced, args));
        };
        prepare(&mut request, 1);
        assert_eq!(request.headers()[PREVIOUS_RPC_ATTEMPTS], "1");
        prepare(&mut request, 3);
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

    // Mutation testing (issue 28): the boundaries and mappings below were
    // left untested by the cases above.

    #[test]
    fn a_pushback_of_exactly_the_maximum_is_honoured() {
        let policy = GrpcPolicy::new().max_pushback(Duration::from_secs(10));
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("14", Some("10000"))),
            Decision::retry_after(Duration::from_secs(10)).because(Cause::Throttled)
        );
    }

    #[test]
    fn a_deadline_exceeded_is_a_timeout_and_other_codes_transient() {
        let policy = GrpcPolicy::new()
            .retry_code(Code::DeadlineExceeded)
            .retry_code(Code::Aborted);
        // In a response.
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("4", None)),
            Decision::retry().because(Cause::Timeout)
        );
        assert_eq!(
            policy.classify_response(StatusCode::OK, &trailers_only("10", None)),
            Decision::retry().because(Cause::Transient)
        );
        // As a transport error.
        assert_eq!(
            policy.classify_error(&tonic::Status::deadline_exceeded("late")),
            Decision::retry().because(Cause::Timeout)
        );
        assert_eq!(
            policy.classify_error(&tonic::Status::aborted("conflict")),
            Decision::retry().because(Cause::Transient)
        );
    }

    #[test]
    fn http_statuses_without_a_grpc_status_map_to_their_codes() {
        for (status, code) in [
            (StatusCode::BAD_REQUEST, Code::Internal),
            (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            (StatusCode::FORBIDDEN, Code::PermissionDenied),
            (StatusCode::NOT_FOUND, Code::Unimplemented),
            (StatusCode::TOO_MANY_REQUESTS, Code::Unavailable),
            (StatusCode::BAD_GATEWAY, Code::Unavailable),
            (StatusCode::GATEWAY_TIMEOUT, Code::Unavailable),
            (StatusCode::IM_A_TEAPOT, Code::Unknown),
        ] {
            let only = GrpcPolicy::new().codes(CodeSet::EMPTY.with(code));
            assert!(
                only.classify_response(status, &HeaderMap::new()).is_retry(),
                "{status} is {code:?}"
            );
            // And only that code: Unknown is not what these map to.
            if code != Code::Unknown {
                let unknown = GrpcPolicy::new().codes(CodeSet::EMPTY.with(Code::Unknown));
                assert_eq!(
                    unknown.classify_response(status, &HeaderMap::new()),
                    Decision::Final,
                    "{status}"
                );
            }
        }
    }

    #[test]
    fn hedges_carry_the_number_of_attempts_before_them() {
        let policy = GrpcPolicy::new();
        let mut copy = Request::new(String::new());
        let prepare = |copy: &mut Request<String>, attempt| {
            Policy::<_, Response<()>, std::io::Error>::prepare_hedge(&policy, copy, attempt)
        };
        assert!(prepare(&mut copy, 2));
        assert_eq!(copy.headers()[PREVIOUS_RPC_ATTEMPTS], "1");
        assert!(prepare(&mut copy, 3));
        assert_eq!(copy.headers()[PREVIOUS_RPC_ATTEMPTS], "2");
    }

    #[test]
    fn a_throttle_at_half_refuses_hedges_and_keeps_hedged_failures_non_fatal() {
        let throttle = Arc::new(RetryThrottle::new(2.0, 0.5).unwrap());
        let policy = GrpcPolicy::new()
            .throttle(Arc::clone(&throttle))
            .for_hedging();
        let mut copy = Request::new(String::new());
        let hedge = |copy: &mut Request<String>| {
            Policy::<_, Response<()>, std::io::Error>::prepare_hedge(&policy, copy, 2)
        };
        assert!(hedge(&mut copy));
        // Counted (2 → 1, at half), yet still a failure of this copy only:
        // the copies still pending may win. No further hedge goes out.
        assert!(classify(&policy, trailers_only("14", None)).is_retry());
        assert_eq!(throttle.tokens(), 1.0);
        let mut refused = Request::new(String::new());
        assert!(!hedge(&mut refused));
        assert!(!refused.headers().contains_key(PREVIOUS_RPC_ATTEMPTS));
    }
}
