//! [`HttpPolicy`]: retries what HTTP says is transient and safe to repeat.

use std::error::Error;
use std::fmt;
use std::time::{Duration, SystemTime};

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::{Extensions, Method, Request, Response, StatusCode};
use http_body::Body;

use super::body::CloneBody;
use super::buffer::BufferedBytes;
use super::delay_headers::DelayHeaders;
use super::drain::{drain, DEFAULT_DRAIN_LIMIT, DEFAULT_DRAIN_TIMEOUT};
use super::error::{classify_error, is_unsent, AsStdError};
use super::method::MethodSet;
use super::status::StatusSet;
use tower_backoff_core::policy::{Cause, Decision, Policy, PrepareRetry};
use tower_backoff_core::Rng;

/// The header that makes a non-idempotent request safe to retry, from the IETF
/// draft "The Idempotency-Key HTTP Header Field" (used by Stripe, PayPal, ...),
/// unless its value is empty or only whitespace.
#[doc(hidden)]
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `x-should-retry`: `true` or `false` from the server, overriding the status
/// (sent by the OpenAI and Anthropic APIs, honoured by their clients).
#[doc(hidden)]
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// `x-retry-attempt`: the attempt number (`2` on the first retry) the policy
/// sends on every retry and hedge by default, so that a server (tower-backoff's
/// `shed` layer, a proxy) can shed retries before first attempts.
#[doc(hidden)]
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");

/// The longest server-given delay the policy waits by default: one minute.
///
/// The OpenAI and Anthropic client libraries honour `Retry-After` up to 60 s
/// too. A longer wait holds the caller's request (and the response's
/// connection) for longer than most callers would wait, and a server that
/// asks for it is down rather than busy: the policy returns its response at
/// once instead, never retrying before the time it asked for.
#[doc(hidden)]
pub const DEFAULT_MAX_SERVER_DELAY: Duration = Duration::from_secs(60);

/// Upward jitter on server delays by default: up to 10 % of the delay...
#[doc(hidden)]
pub const DEFAULT_SERVER_JITTER_PERCENT: u8 = 10;
/// ...and at most one second, which is already a millisecond apart for each
/// of a thousand clients told the same time.
#[doc(hidden)]
pub const DEFAULT_SERVER_JITTER_MAX: Duration = Duration::from_secs(1);

/// Retries HTTP requests that are safe to repeat, when the outcome says trying
/// again may help, after the delay the server asked for if it asked.
///
/// - **What may be repeated**: idempotent methods (GET, HEAD, OPTIONS, TRACE,
///   PUT, DELETE), and any request carrying an `Idempotency-Key` header that
///   is not blank (empty or only whitespace). Any other request goes out
///   once, and its outcome is returned untouched, whatever it is. Its body
///   must be copyable: a `Clone` body, or a streaming one wrapped in a
///   [`ReplayBody`](super::ReplayBody).
/// - **Which responses**: 408, 429, 502, 503, 504 ([`StatusSet::DEFAULT`]);
///   500 with one call, [`retry_status`](Self::retry_status). Other 5xx are
///   final failures; everything else is a success.
/// - **Which errors**: connection failures and timeouts, found anywhere in the
///   error's `source()` chain, and with the `http2` feature HTTP/2 stream
///   resets and `GOAWAY`s ([`classify_error`]).
/// - **Why**: 429 and 503 are [`Cause::Throttled`], so adaptive pacing slows
///   down; 504 and timeouts are [`Cause::Timeout`]; the rest is
///   [`Cause::Transient`]. The layer's default budget charges every retry
///   the same, whatever its cause; [`TokenBucket::new`](tower_backoff_core::TokenBucket::new)
///   (AWS's standard mode) charges a timeout's retry twice a transient one's.
/// - **Unless the server says**: `x-should-retry: false` makes any response
///   final, `x-should-retry: true` makes a 4xx or 5xx retryable
///   ([`should_retry_header`](Self::should_retry_header)).
/// - **When**: a delay the server names ([`DelayHeaders`]: `retry-after-ms`,
///   `Retry-After`, `RateLimit-Reset`, `X-RateLimit-Reset`) replaces the
///   schedule's, plus a little upward jitter
///   ([`server_delay_jitter`](Self::server_delay_jitter)), and is slept in
///   full, never shortened to the schedule's cap. A delay longer than
///   [`max_server_delay`](Self::max_server_delay) (default one minute) ends
///   the request at once with the response. A malformed, zero or past value
///   leaves the delay to the schedule.
///   The [module docs](super#what-each-server-signal-does) have a table of
///   every signal.
///
/// A response retried away has its small body read to the end in the
/// background so its connection can be reused ([`drain_limit`](Self::drain_limit)).
/// Behind an [`HttpRetryLayer`](super::HttpRetryLayer), every response
/// returned carries a [`RetryInfo`](super::RetryInfo) in its extensions.
///
/// The same policy serves hyper-util's client (`http::Request<B>` /
/// `http::Response<B>`) and, with the `reqwest` feature, `reqwest::Client`.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::http::{HttpPolicy, HttpRetryLayer, RetryInfo};
/// use tower_backoff::Exponential;
///
/// // Stands in for an HTTP client: busy once, then fine.
/// let calls = std::sync::atomic::AtomicU32::new(0);
/// let client = service_fn(|_req: Request<String>| {
///     let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     let status = if n == 0 { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
///     async move {
///         let response = Response::builder().status(status).body(Full::new(Bytes::new()));
///         Ok::<_, std::io::Error>(response.unwrap())
///     }
/// });
///
/// let svc = ServiceBuilder::new()
///     .layer(
///         HttpRetryLayer::builder()
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
    delay_headers: DelayHeaders,
    max_server_delay: Duration,
    jitter_percent: u8,
    jitter_max: Duration,
    should_retry: Option<HeaderName>,
    attempt_header: Option<HeaderName>,
    drain_limit: usize,
    drain_timeout: Duration,
    on_body: Option<BodyClassifier>,
    classify_error: fn(&(dyn Error + 'static)) -> Option<Cause>,
    retry_unsent: bool,
}

/// Reads a response buffered whole: `Some(cause)` to retry it.
type BodyClassifier = fn(StatusCode, &HeaderMap, &[u8]) -> Option<Cause>;

impl HttpPolicy {
    /// The defaults described on the type.
    pub fn new() -> Self {
        Self {
            statuses: StatusSet::DEFAULT,
            methods: MethodSet::IDEMPOTENT,
            idempotency_key: Some(IDEMPOTENCY_KEY),
            delay_headers: DelayHeaders::ALL,
            max_server_delay: DEFAULT_MAX_SERVER_DELAY,
            jitter_percent: DEFAULT_SERVER_JITTER_PERCENT,
            jitter_max: DEFAULT_SERVER_JITTER_MAX,
            should_retry: Some(X_SHOULD_RETRY),
            attempt_header: Some(X_RETRY_ATTEMPT),
            drain_limit: DEFAULT_DRAIN_LIMIT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            on_body: None,
            classify_error,
            retry_unsent: false,
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

    /// The header whose presence, with a value that is not blank, makes any
    /// request retryable (default [`IDEMPOTENCY_KEY`]). Prefer
    /// `HeaderName::from_static`: a name built at run time is
    /// reference-counted, and every clone of the service would touch its
    /// count.
    pub fn idempotency_key(mut self, header: HeaderName) -> Self {
        self.idempotency_key = Some(header);
        self
    }

    /// Retries only by method: no header makes a request retryable.
    pub fn without_idempotency_key(mut self) -> Self {
        self.idempotency_key = None;
        self
    }

    /// Ignores every delay header (`Retry-After` and the others of
    /// [`DelayHeaders`]): every delay comes from the schedule. Same as
    /// `delay_headers(DelayHeaders::NONE)`.
    pub fn ignore_retry_after(self) -> Self {
        self.delay_headers(DelayHeaders::NONE)
    }

    /// Reads the server's delay from exactly these headers (default
    /// [`DelayHeaders::ALL`]).
    pub fn delay_headers(mut self, headers: DelayHeaders) -> Self {
        self.delay_headers = headers;
        self
    }

    /// The longest server-given delay the policy waits (default
    /// [`DEFAULT_MAX_SERVER_DELAY`], one minute). A response asking for more
    /// is returned at once: waiting less than asked would retry before the
    /// server is ready, and waiting longer holds the caller. `Duration::MAX`
    /// waits whatever the server says (the layer's
    /// [`max_elapsed`](tower_backoff_core::BackoffBuilder::max_elapsed) still ends a
    /// request whose wait would pass it).
    pub fn max_server_delay(mut self, limit: Duration) -> Self {
        self.max_server_delay = limit;
        self
    }

    /// Lengthens each server-given delay by a random amount up to `percent`
    /// of it and at most `at_most` (default 10 %, at most 1 s), so clients
    /// told the same HTTP-date do not all come back in the same millisecond.
    /// Only ever upward: a retry never comes before the server asked.
    /// `percent` above 100 counts as 100; `server_delay_jitter(0, ..)` turns
    /// it off.
    ///
    /// The policy is shared and stateless, so the randomness comes from
    /// [`Rng::from_entropy`]: a per-thread SplitMix64 sequence, seeded once
    /// per thread from std's `RandomState`, with no lock, no allocation and
    /// no system call after the first. It is not reproducible with the
    /// layer's [`seed`](tower_backoff_core::BackoffBuilder::seed).
    pub fn server_delay_jitter(mut self, percent: u8, at_most: Duration) -> Self {
        self.jitter_percent = percent.min(100);
        self.jitter_max = at_most;
        self
    }

    /// Reads the server's retry advice from `header` (default
    /// [`X_SHOULD_RETRY`]): `true` makes a 4xx or 5xx response retryable
    /// whatever its status, `false` makes any response final. Other values
    /// are ignored. Requests that may not be repeated stay unrepeated.
    pub fn should_retry_header(mut self, header: HeaderName) -> Self {
        self.should_retry = Some(header);
        self
    }

    /// Classifies by status alone: no header overrides it.
    pub fn ignore_should_retry(mut self) -> Self {
        self.should_retry = None;
        self
    }

    /// Sends the attempt number (`2` for the first retry) in `header` on
    /// every retry, so servers and proxies can tell retries from first
    /// attempts and shed them first (as Envoy's `x-envoy-attempt-count` and
    /// the AWS SDKs' `amz-sdk-request` do). First attempts go out untouched.
    /// Default [`X_RETRY_ATTEMPT`], which the `shed` layer reads;
    /// [`no_attempt_header`](Self::no_attempt_header) turns it off.
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use http::HeaderName;
    /// use tower_backoff::http::HttpPolicy;
    ///
    /// let policy = HttpPolicy::new()
    ///     .attempt_header(HeaderName::from_static("x-envoy-attempt-count"));
    /// # drop(policy);
    /// ```
    pub fn attempt_header(mut self, header: HeaderName) -> Self {
        self.attempt_header = Some(header);
        self
    }

    /// Sends retries with the first attempt's headers, unmarked: a server
    /// then cannot tell them apart to shed them first.
    pub fn no_attempt_header(mut self) -> Self {
        self.attempt_header = None;
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

    /// Also retries a response whose body, read whole by a
    /// [`BufferBody`](super::parts::BufferBody) inside the retry layer, makes
    /// `classify` return a cause, as `Some(Cause::Throttled)` for a service
    /// that answers `200` with "queue capacity" in the body. Off by default.
    ///
    /// It is asked only about responses the policy would not retry anyway,
    /// and never about one with `x-should-retry: false`, nor about a body
    /// longer than the buffer's limit (which was not read: such a response
    /// is classified on its status and headers). A response it retries is
    /// retried as a retryable status is: only when the request may be
    /// repeated, after the server's delay if its headers name one. Without a
    /// `BufferBody` it is never asked. It reads hyper-util's
    /// `http::Response`s and `reqwest::Response`s alike.
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use tower_backoff::Cause;
    /// use tower_backoff::http::HttpPolicy;
    ///
    /// let policy = HttpPolicy::new().retry_on_body(|_status, _headers, body| {
    ///     body.windows(14).any(|w| w == b"queue capacity").then_some(Cause::Throttled)
    /// });
    /// # drop(policy);
    /// ```
    pub fn retry_on_body(
        mut self,
        classify: fn(StatusCode, &HeaderMap, &[u8]) -> Option<Cause>,
    ) -> Self {
        self.on_body = Some(classify);
        self
    }

    /// Whether it reads response bodies ([`retry_on_body`](Self::retry_on_body)),
    /// and so needs them read ahead.
    pub(crate) fn classifies_bodies(&self) -> bool {
        self.on_body.is_some()
    }

    /// What a response means, its buffered body included (see
    /// [`retry_on_body`](Self::retry_on_body)). `extensions` are the
    /// response's, where `BufferBody` leaves the bytes.
    #[inline]
    pub(crate) fn classify_parts(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Decision {
        // Without a body classifier, one test of a field and the same
        // decision as `classify_response`, at its cost.
        match self.on_body {
            None => self.classify_response(status, headers),
            Some(on_body) => self.classify_with_body(on_body, status, headers, extensions),
        }
    }

    /// The decision on status and headers, unless `on_body` retries the
    /// response's buffered body.
    #[inline(never)]
    fn classify_with_body(
        &self,
        on_body: BodyClassifier,
        status: StatusCode,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Decision {
        let decision = self.classify_response(status, headers);
        if decision.is_retry() || self.server_advice(headers) == Some(false) {
            return decision;
        }
        let Some(body) = extensions.get::<BufferedBytes>() else {
            return decision;
        };
        match on_body(status, headers, body.as_bytes()) {
            Some(cause) => self.retry_with_server_delay(headers, cause),
            None => decision,
        }
    }

    /// Replaces the error classifier (default [`classify_error`]): return the
    /// cause of a retryable error, `None` for a final one. Wrap the default to
    /// extend it:
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use tower_backoff::Cause;
    /// use tower_backoff::http::{classify_error, HttpPolicy};
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

    /// Also retries a request that provably never reached the server, once
    /// at once and then as any retry, whatever its method: a POST too. Off
    /// by default.
    ///
    /// "Provably" is what [`is_unsent`](super::is_unsent) recognises: a
    /// connection that was never made (refused, DNS failure, TLS handshake),
    /// a request hyper handed back unwritten (a pooled connection found
    /// closed before the request was written to it), or, with the `http2`
    /// feature, an HTTP/2 stream the server refused (`REFUSED_STREAM`) or
    /// never processed (after the last stream its `GOAWAY` names). A
    /// request that was written, even in part, and then lost its connection
    /// (a reset, "connection closed before message completed") may have
    /// been processed: it stays unrepeatable unless its method or an
    /// idempotency key allows it.
    ///
    /// The first such retry is [`Cause::NotSent`]: sent at once, not counted
    /// against the attempt limit, not charged to the budget. Later ones are
    /// ordinary retries (the schedule's delay, the budget's charge), still
    /// only while every failure was provably unsent. The check comes before
    /// the error classifier ([`on_error`](Self::on_error)), so a custom
    /// classifier cannot turn it off by accident.
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use tower_backoff::http::HttpPolicy;
    ///
    /// let policy = HttpPolicy::new().retry_unsent();
    /// # drop(policy);
    /// ```
    pub fn retry_unsent(mut self) -> Self {
        self.retry_unsent = true;
        self
    }

    /// Whether a request with this method and these headers may be sent
    /// twice: its method is one the policy repeats, or it carries an
    /// idempotency key that is not empty (nor only whitespace, which a
    /// server cannot deduplicate on).
    pub fn may_repeat(&self, method: &Method, headers: &HeaderMap) -> bool {
        self.methods.contains(method)
            || self
                .idempotency_key
                .as_ref()
                .and_then(|key| headers.get(key))
                .is_some_and(|value| !value.as_bytes().trim_ascii().is_empty())
    }

    /// What a response with this status and these headers means.
    pub fn classify_response(&self, status: StatusCode, headers: &HeaderMap) -> Decision {
        let listed = self.statuses.contains(status);
        // Advice can only retry an error status, or spare a listed one: for
        // any other answer (a 200) no header is worth looking up.
        if !listed && !status.is_client_error() && !status.is_server_error() {
            return Decision::Success;
        }
        let advice = self.server_advice(headers);
        let retryable = match advice {
            Some(advice) => advice && (status.is_client_error() || status.is_server_error()),
            None => listed,
        };
        if !retryable {
            return if status.is_server_error() || listed {
                Decision::Final
            } else {
                Decision::Success
            };
        }
        let cause = match status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Cause::Throttled,
            StatusCode::GATEWAY_TIMEOUT => Cause::Timeout,
            _ => Cause::Transient,
        };
        self.retry_with_server_delay(headers, cause)
    }

    /// The server's `x-should-retry` advice, if it gave one. Inlined by
    /// force: shared with the body classifier, the compiler kept it out of
    /// line, which cost every response 8 instructions more (callgrind).
    #[inline(always)]
    fn server_advice(&self, headers: &HeaderMap) -> Option<bool> {
        self.should_retry
            .as_ref()
            .and_then(|name| headers.get(name))
            .and_then(should_retry)
    }

    /// A retry for `cause`, after the delay the headers name if any; final
    /// when that delay is longer than the policy waits.
    fn retry_with_server_delay(&self, headers: &HeaderMap, cause: Cause) -> Decision {
        match self.delay_headers.delay(headers, SystemTime::now()) {
            None => Decision::retry(),
            // Asked to wait longer than we would: the answer stands.
            Some(asked) if asked > self.max_server_delay => return Decision::Final,
            Some(asked) => Decision::retry_after(self.jittered(asked)),
        }
        .because(cause)
    }

    /// `delay` plus its upward jitter.
    fn jittered(&self, delay: Duration) -> Duration {
        let spread = (delay / 100)
            .saturating_mul(u32::from(self.jitter_percent))
            .min(self.jitter_max);
        if spread.is_zero() {
            return delay;
        }
        delay.saturating_add(Rng::from_entropy().duration_up_to(spread))
    }

    /// What an error means: a retry for the cause the classifier names, else
    /// a final failure.
    pub fn classify_error(&self, error: &(dyn Error + 'static)) -> Decision {
        if self.retry_unsent && is_unsent(error) {
            return Decision::retry().because(Cause::NotSent);
        }
        match (self.classify_error)(error) {
            Some(cause) => Decision::retry().because(cause),
            None => Decision::Final,
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
            .field("delay_headers", &self.delay_headers)
            .field("max_server_delay", &self.max_server_delay)
            .field("jitter_percent", &self.jitter_percent)
            .field("jitter_max", &self.jitter_max)
            .field("should_retry", &self.should_retry)
            .field("on_body", &self.on_body.is_some())
            .field("attempt_header", &self.attempt_header)
            .field("drain_limit", &self.drain_limit)
            .field("drain_timeout", &self.drain_timeout)
            .field("retry_unsent", &self.retry_unsent)
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
            Ok(response) => {
                self.classify_parts(response.status(), response.headers(), response.extensions())
            }
            Err(error) => self.classify_error(error.as_std_error()),
        };
        self.allow_request_retry(decision, request)
    }

    fn clone_request(&self, request: &Request<ReqBody>) -> Option<Request<ReqBody>> {
        self.copy_request(request)
    }

    /// Stamps the attempt header, and drains the replaced response's body
    /// (unless a [`BufferBody`](super::parts::BufferBody) already read it whole) so
    /// its connection goes back to the pool.
    fn prepare_retry(&self, mut retry: PrepareRetry<'_, Request<ReqBody>, Response<ResBody>, E>) {
        let attempt = retry.args().attempt() + 1;
        self.stamp_attempt(retry.request_mut().headers_mut(), attempt);
        if let Ok(response) = retry.into_replaced() {
            if !BufferedBytes::is_in(response.extensions()) {
                self.discard_body(response.into_body());
            }
        }
    }

    /// Lets out only a copy that may be repeated (an idempotent method, an
    /// `Idempotency-Key`), stamped with its attempt number like a retry.
    fn prepare_hedge(&self, copy: &mut Request<ReqBody>, attempt: u32) -> bool {
        if !self.may_repeat(copy.method(), copy.headers()) {
            return false;
        }
        self.stamp_attempt(copy.headers_mut(), attempt);
        copy.body_mut().mark_concurrent();
        true
    }
}

impl HttpPolicy {
    /// Whether a request with this method and these headers is worth a copy:
    /// it may be repeated, or it may be retried should it never leave.
    pub(crate) fn may_retry(&self, method: &Method, headers: &HeaderMap) -> bool {
        self.retry_unsent || self.may_repeat(method, headers)
    }

    /// `decision` for a request with this method and these headers: a retry
    /// stays one if the request may be repeated, or if it never left.
    pub(crate) fn allow_retry(
        &self,
        decision: Decision,
        method: &Method,
        headers: &HeaderMap,
    ) -> Decision {
        match decision {
            Decision::Retry {
                cause: Cause::NotSent,
                ..
            } => decision,
            Decision::Retry { .. } if !self.may_repeat(method, headers) => Decision::Final,
            other => other,
        }
    }

    /// `decision` for an `http::Request`: [`allow_retry`](Self::allow_retry),
    /// and final when its body can no longer be sent whole.
    pub(crate) fn allow_request_retry<B: CloneBody>(
        &self,
        decision: Decision,
        request: &Request<B>,
    ) -> Decision {
        let decision = self.allow_retry(decision, request.method(), request.headers());
        super::body::unless_spent(decision, request.body())
    }

    /// A copy of `request` for another attempt, if it may have one.
    pub(crate) fn copy_request<B: CloneBody>(&self, request: &Request<B>) -> Option<Request<B>> {
        if !self.may_retry(request.method(), request.headers()) {
            return None;
        }
        super::body::copy_request(request)
    }

    /// Writes the attempt number into the configured attempt header, if any.
    pub(crate) fn stamp_attempt(&self, headers: &mut HeaderMap, attempt: u32) {
        if let Some(name) = &self.attempt_header {
            headers.insert(name.clone(), HeaderValue::from(attempt));
        }
    }
}

/// An `x-should-retry` value: `true` or `false`, any case, else `None`.
fn should_retry(value: &HeaderValue) -> Option<bool> {
    let value = value.as_bytes().trim_ascii();
    if value.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_backoff_core::events::{OutcomeKind, RetryArgs};

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(::http::header::RETRY_AFTER, retry_after.parse().unwrap());
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
            Decision::Final
        );
        assert_eq!(
            policy.classify_response(StatusCode::NOT_IMPLEMENTED, &none),
            Decision::Final
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

    fn with(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                )
            })
            .collect()
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    #[test]
    fn should_retry_false_makes_a_retryable_status_final() {
        let policy = HttpPolicy::new();
        for value in ["false", "FALSE", " False "] {
            let headers = with(&[("x-should-retry", value), ("retry-after", "1")]);
            assert_eq!(
                policy.classify_response(status(503), &headers),
                Decision::Final,
                "{value}"
            );
            assert_eq!(
                policy.classify_response(status(429), &headers),
                Decision::Final,
                "{value}"
            );
        }
        // On a status that was final or a success anyway, nothing changes.
        let no = with(&[("x-should-retry", "false")]);
        assert_eq!(policy.classify_response(status(500), &no), Decision::Final);
        assert_eq!(
            policy.classify_response(status(404), &no),
            Decision::Success
        );
        assert_eq!(
            policy.classify_response(StatusCode::OK, &no),
            Decision::Success
        );
    }

    #[test]
    fn should_retry_true_makes_any_4xx_or_5xx_retryable() {
        let policy = HttpPolicy::new();
        let yes = with(&[("x-should-retry", "true")]);
        assert_eq!(
            policy.classify_response(status(409), &yes),
            Decision::retry()
        );
        assert_eq!(
            policy.classify_response(status(500), &yes),
            Decision::retry()
        );
        assert_eq!(
            policy.classify_response(status(429), &yes),
            Decision::retry().because(Cause::Throttled)
        );
        // A success stays a success, a redirect a redirect.
        assert_eq!(
            policy.classify_response(StatusCode::OK, &yes),
            Decision::Success
        );
        assert_eq!(
            policy.classify_response(status(302), &yes),
            Decision::Success
        );
    }

    #[test]
    fn should_retry_garbage_or_absent_leaves_the_status_to_decide() {
        let policy = HttpPolicy::new();
        for value in ["yes", "1", "", "truefalse", &"t".repeat(10_000)] {
            let headers = with(&[("x-should-retry", value)]);
            assert!(
                policy.classify_response(status(503), &headers).is_retry(),
                "{value:.20}"
            );
            assert_eq!(
                policy.classify_response(status(409), &headers),
                Decision::Success
            );
        }
        assert!(policy
            .classify_response(status(503), &HeaderMap::new())
            .is_retry());
    }

    #[test]
    fn should_retry_can_be_renamed_or_ignored() {
        let no = with(&[("x-should-retry", "false"), ("x-retry", "true")]);
        let ignoring = HttpPolicy::new().ignore_should_retry();
        assert!(ignoring.classify_response(status(503), &no).is_retry());
        assert_eq!(
            ignoring.classify_response(status(409), &no),
            Decision::Success
        );
        let renamed = HttpPolicy::new().should_retry_header(HeaderName::from_static("x-retry"));
        assert!(renamed.classify_response(status(409), &no).is_retry());
    }

    #[test]
    fn a_server_delay_longer_than_the_limit_returns_the_response_at_once() {
        let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
        let minute = with(&[("retry-after", "60")]);
        let longer = with(&[("retry-after", "61")]);
        assert_eq!(
            policy.classify_response(status(503), &minute),
            Decision::retry_after(Duration::from_secs(60)).because(Cause::Throttled)
        );
        assert_eq!(
            policy.classify_response(status(503), &longer),
            Decision::Final
        );
        for huge in ["999999999999", "18446744073709551616", &"9".repeat(64)] {
            let headers = with(&[("retry-after", huge)]);
            assert_eq!(
                policy.classify_response(status(503), &headers),
                Decision::Final,
                "{huge:.20}"
            );
        }
        let patient = policy.max_server_delay(Duration::from_secs(3600));
        assert!(patient.classify_response(status(503), &longer).is_retry());
        assert_eq!(
            patient.classify_response(status(503), &with(&[("retry-after", "3601")])),
            Decision::Final
        );
        let unlimited = HttpPolicy::new().max_server_delay(Duration::MAX);
        assert!(unlimited
            .classify_response(
                status(503),
                &with(&[("retry-after", "18446744073709551616")])
            )
            .is_retry());
    }

    #[test]
    fn every_delay_header_is_read_and_can_be_turned_off() {
        let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
        let ms = with(&[("retry-after-ms", "1500")]);
        let reset = with(&[("ratelimit-reset", "3")]);
        let x_reset = with(&[("x-ratelimit-reset", "4")]);
        let after = |d| Decision::retry_after(d).because(Cause::Throttled);
        assert_eq!(
            policy.classify_response(status(429), &ms),
            after(Duration::from_millis(1500))
        );
        assert_eq!(
            policy.classify_response(status(429), &reset),
            after(Duration::from_secs(3))
        );
        assert_eq!(
            policy.classify_response(status(429), &x_reset),
            after(Duration::from_secs(4))
        );
        let only = policy.clone().delay_headers(DelayHeaders::RETRY_AFTER);
        for headers in [&ms, &reset, &x_reset] {
            assert_eq!(
                only.classify_response(status(429), headers),
                Decision::retry().because(Cause::Throttled)
            );
        }
        let none = policy.ignore_retry_after();
        assert_eq!(
            none.classify_response(status(429), &with(&[("retry-after", "61")])),
            Decision::retry().because(Cause::Throttled),
            "an ignored header cannot end the request either"
        );
    }

    fn delay_of(decision: Decision) -> Duration {
        match decision {
            Decision::Retry { after: Some(d), .. } => d,
            other => panic!("no server delay: {other:?}"),
        }
    }

    #[test]
    fn server_delays_are_jittered_upward_within_the_bound() {
        let policy = HttpPolicy::new();
        let two = with(&[("retry-after", "2")]);
        let sixty = with(&[("retry-after", "60")]);
        for _ in 0..1_000 {
            let d = delay_of(policy.classify_response(status(503), &two));
            assert!(d >= Duration::from_secs(2), "{d:?}");
            assert!(d <= Duration::from_millis(2200), "10 % of 2 s: {d:?}");
            let d = delay_of(policy.classify_response(status(503), &sixty));
            assert!(
                d >= Duration::from_secs(60) && d <= Duration::from_secs(61),
                "1 s at most: {d:?}"
            );
        }
        let tight = HttpPolicy::new().server_delay_jitter(50, Duration::from_millis(10));
        let d = delay_of(tight.classify_response(status(503), &two));
        assert!(
            d >= Duration::from_secs(2) && d <= Duration::from_millis(2010),
            "{d:?}"
        );
        let wide = HttpPolicy::new().server_delay_jitter(255, Duration::MAX);
        let d = delay_of(wide.classify_response(status(503), &two));
        assert!(
            d >= Duration::from_secs(2) && d <= Duration::from_secs(4),
            "over 100 % is 100 %: {d:?}"
        );
        let off = HttpPolicy::new().server_delay_jitter(0, Duration::MAX);
        assert_eq!(
            delay_of(off.classify_response(status(503), &two)),
            Duration::from_secs(2)
        );
    }

    /// How many of 1,000 classifications of a 503 told to come back at the
    /// same HTTP-date, 3 s ahead, fall into the fullest 10 ms of delay.
    fn fullest_10ms_bucket(policy: &HttpPolicy) -> u32 {
        let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3));
        let told = with(&[("retry-after", &date)]);
        let mut buckets = std::collections::HashMap::<u128, u32>::new();
        for _ in 0..1_000 {
            let delay = delay_of(policy.classify_response(status(503), &told));
            *buckets.entry(delay.as_millis() / 10).or_default() += 1;
        }
        *buckets.values().max().unwrap()
    }

    #[test]
    fn a_thousand_clients_told_the_same_http_date_spread_over_many_10ms_buckets() {
        // 2-3 s ahead in whole seconds, plus up to 10 %: 200-300 ms of spread,
        // at most 5 % of the requests per 10 ms on average.
        let fullest = fullest_10ms_bucket(&HttpPolicy::new());
        assert!(fullest <= 80, "{fullest}");
        let without =
            fullest_10ms_bucket(&HttpPolicy::new().server_delay_jitter(0, Duration::ZERO));
        // Without jitter only the real time the loop takes moves the
        // delays: a few milliseconds, so at most three buckets.
        assert!(without >= 300, "without jitter they cluster: {without}");
    }

    #[test]
    fn jitter_does_not_overflow_an_unlimited_delay() {
        let policy = HttpPolicy::new().max_server_delay(Duration::MAX);
        let huge = with(&[("retry-after-ms", &"9".repeat(64))]);
        assert_eq!(
            delay_of(policy.classify_response(status(503), &huge)),
            Duration::MAX
        );
    }

    /// Prepares `request` as attempt number `attempt` (2 for the first
    /// retry), replacing a 503.
    fn prepare(policy: &HttpPolicy, request: &mut Request<String>, attempt: u32) {
        let replaced: Result<Response<String>, std::io::Error> = Ok(Response::new(String::new()));
        let args = RetryArgs::new(
            attempt - 1,
            Duration::ZERO,
            Cause::Transient,
            OutcomeKind::Response,
        );
        Policy::prepare_retry(policy, PrepareRetry::new(request, replaced, args));
    }

    #[test]
    fn the_attempt_header_is_x_retry_attempt_unless_named_or_turned_off() {
        let mut request = Request::get("http://127.0.0.1/")
            .body(String::new())
            .unwrap();
        prepare(&HttpPolicy::new().no_attempt_header(), &mut request, 2);
        assert!(request.headers().is_empty());
        prepare(&HttpPolicy::new(), &mut request, 2);
        assert_eq!(request.headers()["x-retry-attempt"], "2");
        request.headers_mut().clear();
        let named =
            HttpPolicy::new().attempt_header(HeaderName::from_static("x-envoy-attempt-count"));
        prepare(&named, &mut request, 2);
        prepare(&named, &mut request, 3);
        let values: Vec<_> = request
            .headers()
            .get_all("x-envoy-attempt-count")
            .iter()
            .collect();
        assert_eq!(values, ["3"], "replaced, not appended");
    }

    #[test]
    fn retry_after_becomes_the_delay() {
        let policy = HttpPolicy::new().server_delay_jitter(0, Duration::ZERO);
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
    fn retry_after_zero_asks_for_a_retry_now() {
        // RFC 9110's "retry now": a delay of zero, which paces nothing, so
        // the layer's budget still pays for the retry.
        let policy = HttpPolicy::new();
        assert_eq!(
            policy.classify_response(StatusCode::SERVICE_UNAVAILABLE, &headers("0")),
            Decision::retry_after(Duration::ZERO).because(Cause::Throttled)
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
    fn an_empty_or_blank_idempotency_key_does_not_make_a_post_repeatable() {
        let custom = HttpPolicy::new().idempotency_key(HeaderName::from_static("x-request-id"));
        for value in ["", " ", "\t", " \t  "] {
            let blank = HeaderValue::from_str(value).unwrap();
            let mut headers = HeaderMap::new();
            headers.insert(IDEMPOTENCY_KEY, blank.clone());
            headers.insert("x-request-id", blank);
            assert!(
                !HttpPolicy::new().may_repeat(&Method::POST, &headers),
                "{value:?}"
            );
            assert!(!custom.may_repeat(&Method::POST, &headers), "{value:?}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_static(" k "));
        assert!(HttpPolicy::new().may_repeat(&Method::POST, &headers));
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
    fn statuses_replaces_the_whole_set() {
        let policy = HttpPolicy::new().statuses(StatusSet::EMPTY.with(StatusCode::CONFLICT));
        let none = HeaderMap::new();
        assert!(policy.classify_response(status(409), &none).is_retry());
        assert_eq!(
            policy.classify_response(status(503), &none),
            Decision::Final
        );
        assert_eq!(
            policy.classify_response(status(429), &none),
            Decision::Success
        );
    }

    #[test]
    fn retry_statuses_adds_a_range_and_never_retry_status_removes_one() {
        let none = HeaderMap::new();
        let all_5xx = HttpPolicy::new().retry_statuses(500..=599);
        for code in [500, 501, 507, 599] {
            assert!(
                all_5xx.classify_response(status(code), &none).is_retry(),
                "{code}"
            );
        }
        assert_eq!(
            all_5xx.classify_response(status(499), &none),
            Decision::Success
        );
        let no_503 = HttpPolicy::new().never_retry_status(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            no_503.classify_response(status(503), &none),
            Decision::Final
        );
        assert!(no_503.classify_response(status(502), &none).is_retry());
    }

    #[test]
    fn methods_replaces_the_whole_set() {
        let none = HeaderMap::new();
        let only_post = HttpPolicy::new().methods(MethodSet::EMPTY.with(Method::POST));
        assert!(only_post.may_repeat(&Method::POST, &none));
        assert!(!only_post.may_repeat(&Method::GET, &none));
        let nothing = HttpPolicy::new()
            .methods(MethodSet::EMPTY)
            .without_idempotency_key();
        assert!(!nothing.may_repeat(&Method::GET, &none));
    }

    #[test]
    fn default_is_new() {
        assert_eq!(
            format!("{:?}", HttpPolicy::default()),
            format!("{:?}", HttpPolicy::new())
        );
    }

    #[test]
    fn debug_shows_every_setting() {
        let policy = HttpPolicy::new()
            .drain_limit(7)
            .drain_timeout(Duration::from_millis(1234))
            .max_server_delay(Duration::from_secs(9))
            .server_delay_jitter(5, Duration::from_millis(77))
            .attempt_header(HeaderName::from_static("x-attempt"))
            .ignore_should_retry();
        let shown = format!("{policy:?}");
        for part in [
            "drain_limit: 7",
            "drain_timeout: 1.234s",
            "max_server_delay: 9s",
            "jitter_percent: 5",
            "jitter_max: 77ms",
            "should_retry: None",
            "\"x-attempt\"",
        ] {
            assert!(shown.contains(part), "{part} in {shown}");
        }
    }

    #[test]
    fn a_custom_error_classifier_replaces_the_default() {
        let policy = HttpPolicy::new().on_error(|_| Some(Cause::Throttled));
        let error = std::io::Error::other("anything");
        assert_eq!(
            policy.classify_error(&error),
            Decision::retry().because(Cause::Throttled)
        );
        assert_eq!(HttpPolicy::new().classify_error(&error), Decision::Final);
    }
}
