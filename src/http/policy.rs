//! [`HttpPolicy`]: retries what HTTP says is transient and safe to repeat.

use std::error::Error;
use std::fmt;
use std::time::{Duration, SystemTime};

use ::http::header::{HeaderMap, HeaderName, RETRY_AFTER};
use ::http::{Method, Request, Response, StatusCode};
use http_body::Body;

use super::body::CloneBody;
use super::drain::{drain, DEFAULT_DRAIN_LIMIT, DEFAULT_DRAIN_TIMEOUT};
use super::error::{classify_error, AsStdError};
use super::info::RetryInfo;
use super::method::MethodSet;
use super::retry_after::parse_retry_after;
use super::status::StatusSet;
use crate::policy::{Cause, Decision, Policy, RetryLimits};

/// The header that makes a non-idempotent request safe to retry, from the IETF
/// draft "The Idempotency-Key HTTP Header Field" (used by Stripe, PayPal, ...).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Retries HTTP requests that are safe to repeat, when the outcome says trying
/// again may help, after the delay the server asked for if it asked.
///
/// - **What may be repeated**: idempotent methods (GET, HEAD, OPTIONS, TRACE,
///   PUT, DELETE), and any request carrying an `Idempotency-Key` header. Any
///   other request goes out once, and its outcome is returned untouched,
///   whatever it is. Its body must be copyable: a `Clone` body, or a streaming
///   one wrapped in a [`ReplayBody`](super::ReplayBody).
/// - **Which responses**: 408, 429, 502, 503, 504 ([`StatusSet::DEFAULT`]);
///   500 with one call, [`retry_status`](Self::retry_status). Other 5xx are
///   final failures; everything else is a success.
/// - **Which errors**: connection failures and timeouts, found anywhere in the
///   error's `source()` chain ([`classify_error`]).
/// - **Why**: 429 and 503 are [`Cause::Throttled`], so adaptive pacing slows
///   down; 504 and timeouts are [`Cause::Timeout`], which a token bucket charges
///   more; the rest is [`Cause::Transient`].
/// - **When**: `Retry-After` ([`parse_retry_after`]) replaces the schedule's
///   delay, capped by the schedule's [`cap`](crate::Schedule::cap). A malformed, enormous or past
///   value leaves the delay to the schedule.
///
/// A response retried away has its small body read to the end in the
/// background so its connection can be reused ([`drain_limit`](Self::drain_limit)).
/// Every response returned carries a [`RetryInfo`] in its extensions (unless
/// [`without_retry_info`](Self::without_retry_info)).
///
/// The same policy serves hyper-util's client (`http::Request<B>` /
/// `http::Response<B>`) and, with the `reqwest` feature, `reqwest::Client`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::http::{HttpPolicy, RetryInfo};
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// // Stands in for an HTTP client: busy once, then fine.
/// let calls = std::sync::atomic::AtomicU32::new(0);
/// let client = service_fn(|_req: Request<String>| {
///     let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     let status = if n == 0 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
///     async move {
///         Ok::<_, std::io::Error>(Response::builder().status(status).body(String::new()).unwrap())
///     }
/// });
///
/// let svc = ServiceBuilder::new()
///     .layer(
///         BackoffLayer::builder()
///             .policy(HttpPolicy::new().retry_status(StatusCode::INTERNAL_SERVER_ERROR))
///             .schedule(Exponential::new(Duration::from_millis(1)))
///             .build()?,
///     )
///     .service(client);
///
/// let response = svc.oneshot(Request::get("http://example.com/").body(String::new())?).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct HttpPolicy {
    statuses: StatusSet,
    methods: MethodSet,
    idempotency_key: Option<HeaderName>,
    honor_retry_after: bool,
    drain_limit: usize,
    drain_timeout: Duration,
    record_info: bool,
    classify_error: fn(&(dyn Error + 'static)) -> Option<Cause>,
}

impl HttpPolicy {
    /// The defaults described on the type.
    pub fn new() -> Self {
        Self {
            statuses: StatusSet::DEFAULT,
            methods: MethodSet::IDEMPOTENT,
            idempotency_key: Some(IDEMPOTENCY_KEY),
            honor_retry_after: true,
            drain_limit: DEFAULT_DRAIN_LIMIT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            record_info: true,
            classify_error,
        }
    }

    /// Also retries `status`; `retry_status(StatusCode::INTERNAL_SERVER_ERROR)`
    /// turns on 500.
    pub fn retry_status(mut self, status: StatusCode) -> Self {
        self.statuses = self.statuses.with(status);
        self
    }

    /// Also retries every status in `range` (`500..=599`); codes outside
    /// 100..=599 are skipped.
    pub fn retry_statuses(mut self, range: std::ops::RangeInclusive<u16>) -> Self {
        self.statuses = self.statuses.with_range(range);
        self
    }

    /// Never retries `status`.
    pub fn never_retry_status(mut self, status: StatusCode) -> Self {
        self.statuses = self.statuses.without(status);
        self
    }

    /// Retries exactly `statuses`.
    pub fn statuses(mut self, statuses: StatusSet) -> Self {
        self.statuses = statuses;
        self
    }

    /// Also sends requests with `method` more than once, with or without an
    /// idempotency key.
    pub fn retry_method(mut self, method: Method) -> Self {
        self.methods = self.methods.with(method);
        self
    }

    /// Sends requests with exactly these methods more than once without an
    /// idempotency key (default [`MethodSet::IDEMPOTENT`]).
    pub fn methods(mut self, methods: MethodSet) -> Self {
        self.methods = methods;
        self
    }

    /// The header whose presence makes any request retryable (default
    /// [`IDEMPOTENCY_KEY`]). Prefer `HeaderName::from_static`: a name built at
    /// run time is reference-counted, and every clone of the service would
    /// touch its count.
    pub fn idempotency_key(mut self, header: HeaderName) -> Self {
        self.idempotency_key = Some(header);
        self
    }

    /// Retries only by method: no header makes a request retryable.
    pub fn without_idempotency_key(mut self) -> Self {
        self.idempotency_key = None;
        self
    }

    /// Ignores `Retry-After`: every delay comes from the schedule.
    pub fn ignore_retry_after(mut self) -> Self {
        self.honor_retry_after = false;
        self
    }

    /// Most bytes read from a retried-away response body to keep its
    /// connection (default [`DEFAULT_DRAIN_LIMIT`]); 0 always drops the body,
    /// which closes an HTTP/1 connection that still had body to read.
    pub fn drain_limit(mut self, bytes: usize) -> Self {
        self.drain_limit = bytes;
        self
    }

    /// Longest time spent reading one retried-away body (default
    /// [`DEFAULT_DRAIN_TIMEOUT`]).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Stops adding [`RetryInfo`] to responses. `http::Extensions` boxes every
    /// value, so recording it costs one small allocation per request, the only
    /// one the policy adds to a first-attempt success besides copying the
    /// request.
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// Whether responses get a [`RetryInfo`].
    pub(crate) fn records_info(&self) -> bool {
        self.record_info
    }

    /// Replaces the error classifier (default [`classify_error`]): return the
    /// cause of a retryable error, `None` for a final one. Wrap the default to
    /// extend it:
    ///
    /// ```
    /// use tower_backoff::{http::{classify_error, HttpPolicy}, Cause};
    ///
    /// let policy = HttpPolicy::new().on_error(|error| {
    ///     classify_error(error).or_else(|| {
    ///         error.to_string().contains("GOAWAY").then_some(Cause::Transient)
    ///     })
    /// });
    /// # drop(policy);
    /// ```
    pub fn on_error(mut self, classify: fn(&(dyn Error + 'static)) -> Option<Cause>) -> Self {
        self.classify_error = classify;
        self
    }

    /// Whether a request with this method and these headers may be sent twice.
    pub fn may_repeat(&self, method: &Method, headers: &HeaderMap) -> bool {
        self.methods.contains(method)
            || self
                .idempotency_key
                .as_ref()
                .is_some_and(|key| headers.contains_key(key))
    }

    /// What a response with this status and these headers means.
    pub fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        if !self.statuses.contains(status) {
            return if status.is_server_error() {
                Decision::Fail
            } else {
                Decision::Success
            };
        }
        let cause = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Cause::Throttled,
            StatusCode::GATEWAY_TIMEOUT => Cause::Timeout,
            _ => Cause::Transient,
        };
        let asked = self
            .honor_retry_after
            .then(|| headers.get(RETRY_AFTER))
            .flatten()
            .and_then(|value| parse_retry_after(value, SystemTime::now()));
        match asked {
            Some(delay) => Decision::retry_after(delay),
            None => Decision::retry(),
        }
        .because(cause)
    }

    /// What an error means: a retry for the cause the classifier names, else
    /// a final failure.
    pub fn classify_error(&self, error: &(dyn Error + 'static)) -> Decision {
        match (self.classify_error)(error) {
            Some(cause) => Decision::retry().because(cause),
            None => Decision::Fail,
        }
    }

    pub(crate) fn discard_body<B>(&self, body: B)
    where
        B: Body + Send + 'static,
        B::Data: Send,
    {
        drain(body, self.drain_limit, self.drain_timeout);
    }
}

impl Default for HttpPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for HttpPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpPolicy")
            .field("statuses", &self.statuses)
            .field("methods", &self.methods)
            .field("idempotency_key", &self.idempotency_key)
            .field("honor_retry_after", &self.honor_retry_after)
            .field("drain_limit", &self.drain_limit)
            .field("drain_timeout", &self.drain_timeout)
            .field("record_info", &self.record_info)
            .finish_non_exhaustive()
    }
}

impl<ReqBody, ResBody, E> Policy<Request<ReqBody>, Response<ResBody>, E> for HttpPolicy
where
    ReqBody: CloneBody,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
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
        // The copy shares its recording with the body just sent: if that
        // outgrew the limit, there is nothing whole to send again.
        if decision.is_retry() && !request.body().is_replayable() {
            return Decision::Fail;
        }
        decision
    }

    /// A [`RetryLimits`] in the request's extensions overrides the layer's
    /// limits for that request.
    fn limits(&self, request: &Request<ReqBody>) -> Option<RetryLimits> {
        request.extensions().get::<RetryLimits>().copied()
    }

    fn clone_request(&self, request: &Request<ReqBody>) -> Option<Request<ReqBody>> {
        if !self.may_repeat(request.method(), request.headers()) {
            return None;
        }
        let mut copy = Request::new(request.body().clone_body()?);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }

    fn discard(&self, result: Result<Response<ResBody>, E>) {
        if let Ok(response) = result {
            self.discard_body(response.into_body());
        }
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

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, retry_after.parse().unwrap());
        headers
    }

    #[test]
    fn throttling_statuses_are_throttled_and_504_is_a_timeout() {
        let policy = HttpPolicy::new();
        let none = HeaderMap::new();
        for (status, cause) in [
            (429, Cause::Throttled),
            (503, Cause::Throttled),
            (504, Cause::Timeout),
            (502, Cause::Transient),
            (408, Cause::Transient),
        ] {
            let status = StatusCode::from_u16(status).unwrap();
            assert_eq!(
                policy.classify_response(status, &none),
                Decision::retry().because(cause),
                "{status}"
            );
        }
    }

    #[test]
    fn other_server_errors_fail_and_the_rest_succeeds() {
        let policy = HttpPolicy::new();
        let none = HeaderMap::new();
        assert_eq!(
            policy.classify_response(StatusCode::INTERNAL_SERVER_ERROR, &none),
            Decision::Fail
        );
        assert_eq!(
            policy.classify_response(StatusCode::NOT_IMPLEMENTED, &none),
            Decision::Fail
        );
        assert_eq!(
            policy.classify_response(StatusCode::OK, &none),
            Decision::Success
        );
        assert_eq!(
            policy.classify_response(StatusCode::BAD_REQUEST, &none),
            Decision::Success
        );
        assert_eq!(
            policy.classify_response(StatusCode::NOT_FOUND, &none),
            Decision::Success
        );
    }

    #[test]
    fn one_call_turns_on_500() {
        let policy = HttpPolicy::new().retry_status(StatusCode::INTERNAL_SERVER_ERROR);
        assert!(policy
            .classify_response(StatusCode::INTERNAL_SERVER_ERROR, &HeaderMap::new())
            .is_retry());
    }

    #[test]
    fn retry_after_becomes_the_delay() {
        let policy = HttpPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::TOO_MANY_REQUESTS, &headers("7")),
            Decision::retry_after(Duration::from_secs(7)).because(Cause::Throttled)
        );
        let ignoring = HttpPolicy::new().ignore_retry_after();
        assert_eq!(
            ignoring.classify_response(StatusCode::TOO_MANY_REQUESTS, &headers("7")),
            Decision::retry().because(Cause::Throttled)
        );
    }

    #[test]
    fn retry_after_on_a_final_status_changes_nothing() {
        let policy = HttpPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::OK, &headers("7")),
            Decision::Success
        );
    }

    #[test]
    fn only_idempotent_methods_or_keyed_requests_repeat() {
        let policy = HttpPolicy::new();
        let none = HeaderMap::new();
        let mut keyed = HeaderMap::new();
        keyed.insert(IDEMPOTENCY_KEY, "order-17".parse().unwrap());
        assert!(policy.may_repeat(&Method::GET, &none));
        assert!(policy.may_repeat(&Method::DELETE, &none));
        assert!(!policy.may_repeat(&Method::POST, &none));
        assert!(!policy.may_repeat(&Method::PATCH, &none));
        assert!(policy.may_repeat(&Method::POST, &keyed));
        assert!(!policy
            .clone()
            .without_idempotency_key()
            .may_repeat(&Method::POST, &keyed));
        assert!(policy
            .retry_method(Method::POST)
            .may_repeat(&Method::POST, &none));
    }

    #[test]
    fn a_custom_key_header_replaces_the_default() {
        let policy = HttpPolicy::new().idempotency_key(HeaderName::from_static("x-request-id"));
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, "k".parse().unwrap());
        assert!(!policy.may_repeat(&Method::POST, &headers));
        headers.insert("x-request-id", "k".parse().unwrap());
        assert!(policy.may_repeat(&Method::POST, &headers));
    }

    #[test]
    fn a_copied_request_keeps_method_uri_version_headers_and_extensions() {
        #[derive(Clone, Debug, PartialEq)]
        struct Tag(u8);
        let request = Request::put("http://127.0.0.1/x?y=1")
            .version(::http::Version::HTTP_10)
            .header("x-a", "b")
            .extension(Tag(3))
            .body(String::from("body"))
            .unwrap();
        let copy: Request<String> = Policy::<_, Response<String>, std::io::Error>::clone_request(
            &HttpPolicy::new(),
            &request,
        )
        .unwrap();
        assert_eq!(copy.method(), Method::PUT);
        assert_eq!(copy.uri(), request.uri());
        assert_eq!(copy.version(), ::http::Version::HTTP_10);
        assert_eq!(copy.headers(), request.headers());
        assert_eq!(copy.extensions().get::<Tag>(), Some(&Tag(3)));
        assert_eq!(copy.body(), "body");
    }

    #[test]
    fn a_post_is_not_copied() {
        let request = Request::post("http://127.0.0.1/")
            .body(String::new())
            .unwrap();
        let copy = Policy::<_, Response<String>, std::io::Error>::clone_request(
            &HttpPolicy::new(),
            &request,
        );
        assert!(copy.is_none());
    }

    #[test]
    fn a_custom_error_classifier_replaces_the_default() {
        let policy = HttpPolicy::new().on_error(|_| Some(Cause::Throttled));
        let error = std::io::Error::other("anything");
        assert_eq!(
            policy.classify_error(&error),
            Decision::retry().because(Cause::Throttled)
        );
        assert_eq!(HttpPolicy::new().classify_error(&error), Decision::Fail);
    }
}
