//! [`Rejection`]: why a request was shed, and the answer that tells its
//! client when to come back, or not to.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::criticality::Priority;

/// `retry-after-ms`: the delay in milliseconds, finer than `Retry-After`'s
/// whole seconds (read by tower-backoff's `HttpPolicy`, OpenAI's and
/// Anthropic's clients).
#[doc(hidden)]
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
/// `x-should-retry: false`: do not retry this request at all.
#[doc(hidden)]
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
/// The IETF RateLimit fields' policy and state (draft-ietf-httpapi-ratelimit-headers).
#[doc(hidden)]
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit: "concurrency";r=0;t=<seconds>`: none left, back after `t`.
#[doc(hidden)]
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// gRPC's status in a trailers-only response.
#[doc(hidden)]
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// gRPC's status message.
#[doc(hidden)]
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// gRPC's pushback (gRFC A6): milliseconds to wait, negative for "do not retry".
#[doc(hidden)]
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Why a request was shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The concurrency limit is reached.
    Limit,
    /// Below the limit, but past the share of it the request's
    /// [`Priority`] may fill: lower priorities are shed first.
    Priority,
    /// The rejected demand could not be served within `max_drain`: retrying
    /// cannot help, and the answer says not to.
    Drain,
}

impl Reason {
    /// The label metrics and logs give it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::Priority => "priority",
            Reason::Drain => "drain",
        }
    }
}

/// A request the limiter did not admit, decided before any work was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    pub(crate) reason: Reason,
    pub(crate) priority: Priority,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) limit: usize,
    pub(crate) queue_time: Duration,
}

impl Rejection {
    /// Why it was rejected.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The request's priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// When the client may come back: spread at random across clients.
    /// `None`: it should not retry this request.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether the client is invited to retry.
    pub fn should_retry(&self) -> bool {
        self.retry_after.is_some()
    }

    /// The limit when it was rejected.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The queueing-time estimate when it was rejected.
    pub fn queue_time(&self) -> Duration {
        self.queue_time
    }

    /// The HTTP answer: `status` (503 or 429) with `Retry-After` (the whole
    /// seconds of the delay, at least 1), `retry-after-ms` (the delay,
    /// never shorter than `Retry-After` says) and the RateLimit fields, or
    /// `x-should-retry: false` when it should not retry; an empty body.
    ///
    /// The delays spread over whole seconds, not within one: most clients
    /// read only `Retry-After`, and a fleet told "2" by every rejection
    /// comes back at one instant.
    pub fn http_response<B: Default>(&self, status: StatusCode) -> Response<B> {
        let mut response = Response::new(B::default());
        *response.status_mut() = status;
        let headers = response.headers_mut();
        match self.retry_after {
            Some(delay) => {
                let millis = delay.as_millis().min(u128::from(u64::MAX)) as u64;
                let seconds = (millis / 1000).max(1);
                headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
                headers.insert(RETRY_AFTER_MS, HeaderValue::from(millis));
                headers.insert(
                    RATELIMIT_POLICY,
                    header(format!("\"concurrency\";q={};w=1", self.limit)),
                );
                headers.insert(
                    RATELIMIT,
                    header(format!("\"concurrency\";r=0;t={seconds}")),
                );
            }
            None => {
                headers.insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
            }
        }
        response
    }

    /// The gRPC answer, trailers-only: `code` (8, `RESOURCE_EXHAUSTED`, or
    /// 14, `UNAVAILABLE`) with `grpc-retry-pushback-ms`, negative (`-1`)
    /// when it should not retry.
    pub fn grpc_response<B: Default>(&self, code: u16) -> Response<B> {
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        grpc_headers(headers, code, self);
        response
    }
}

fn grpc_headers(headers: &mut HeaderMap, code: u16, rejection: &Rejection) {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    headers.insert(
        GRPC_MESSAGE,
        HeaderValue::from_static("overloaded%3A%20request%20shed"),
    );
    let pushback = match rejection.retry_after {
        Some(delay) => HeaderValue::from(delay.as_millis().min(i64::MAX as u128) as i64),
        None => HeaderValue::from_static("-1"),
    };
    headers.insert(GRPC_RETRY_PUSHBACK_MS, pushback);
}

fn header(value: String) -> HeaderValue {
    // Built from digits and fixed text only.
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static("\"concurrency\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criticality::Criticality;

    fn rejection(retry_after: Option<Duration>) -> Rejection {
        Rejection {
            reason: if retry_after.is_some() {
                Reason::Limit
            } else {
                Reason::Drain
            },
            priority: Priority::new(Criticality::Default, false),
            retry_after,
            limit: 40,
            queue_time: Duration::from_millis(300),
        }
    }

    #[test]
    fn an_http_rejection_carries_whole_seconds_and_milliseconds_that_agree() {
        let response: Response<()> = rejection(Some(Duration::from_millis(2_734)))
            .http_response(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["retry-after-ms"], "2734");
        assert_eq!(response.headers()["ratelimit"], "\"concurrency\";r=0;t=2");
        assert!(response.headers().get("x-should-retry").is_none());
    }

    #[test]
    fn a_rejection_that_should_not_be_retried_says_so_and_names_no_delay() {
        let response: Response<()> = rejection(None).http_response(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["x-should-retry"], "false");
        assert!(response.headers().get("retry-after").is_none());
        let grpc: Response<()> = rejection(None).grpc_response(8);
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "-1");
        assert_eq!(grpc.headers()["grpc-status"], "8");
    }

    #[test]
    fn a_grpc_rejection_is_trailers_only_with_pushback() {
        let grpc: Response<()> = rejection(Some(Duration::from_millis(1_500))).grpc_response(14);
        assert_eq!(grpc.status(), 200);
        assert_eq!(grpc.headers()["content-type"], "application/grpc");
        assert_eq!(grpc.headers()["grpc-status"], "14");
        assert_eq!(grpc.headers()["grpc-retry-pushback-ms"], "1500");
    }
}
