//! [`HttpPolicy`] for `reqwest::Client`, which is a tower `Service` of
//! `reqwest::Request`: directly, or behind a [`ReplayLayer`](super::parts::ReplayLayer)
//! so streaming bodies are retried too.

use ::http::Request;

use super::body::CloneBody;
use super::buffer::BufferedBytes;
use super::error::AsStdError;
use super::policy::HttpPolicy;
use tower_backoff_core::policy::{Decision, Policy, PrepareRetry};

/// Classifies `reqwest` outcomes as it does `http` ones: statuses and
/// `Retry-After` the same way, errors by `is_timeout()` / `is_connect()` and
/// their `source()` chain. Requests are copied with
/// [`reqwest::Request::try_clone`](https://docs.rs/reqwest/latest/reqwest/struct.Request.html#method.try_clone), so a streaming body goes out once; put a
/// [`ReplayLayer`](super::parts::ReplayLayer) in front to retry those as well.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backoff::http::HttpPolicy;
/// use tower_backoff::{BackoffLayer, Exponential};
///
/// let client = ServiceBuilder::new()
///     .layer(
///         BackoffLayer::builder()
///             .policy(HttpPolicy::new())
///             .schedule(Exponential::new(Duration::from_millis(100)))
///             .build()
///             .unwrap(),
///     )
///     .service(reqwest::Client::new());
/// # drop(client);
/// ```
impl<E> Policy<reqwest::Request, reqwest::Response, E> for HttpPolicy
where
    E: AsStdError,
{
    fn classify(
        &self,
        request: &reqwest::Request,
        result: &Result<reqwest::Response, E>,
    ) -> Decision {
        let decision = classify_outcome(self, result);
        self.allow_retry(decision, request.method(), request.headers())
    }

    fn clone_request(&self, request: &reqwest::Request) -> Option<reqwest::Request> {
        if !self.may_retry(request.method(), request.headers()) {
            return None;
        }
        request.try_clone()
    }

    fn prepare_retry(&self, mut retry: PrepareRetry<'_, reqwest::Request, reqwest::Response, E>) {
        let attempt = retry.args().attempt() + 1;
        self.stamp_attempt(retry.request_mut().headers_mut(), attempt);
        discard(self, retry.into_replaced());
    }

    /// Lets out only a copy that may be repeated (an idempotent method, an
    /// `Idempotency-Key`), stamped with its attempt number like a retry.
    fn prepare_hedge(&self, copy: &mut reqwest::Request, attempt: u32) -> bool {
        if !self.may_repeat(copy.method(), copy.headers()) {
            return false;
        }
        self.stamp_attempt(copy.headers_mut(), attempt);
        true
    }
}

/// A reqwest request on its way through a [`ReplayLayer`](super::parts::ReplayLayer):
/// an `http::Request` whose body records what it sends (a
/// [`ReplayBody`](super::ReplayBody)), answered by `reqwest::Client` through
/// an [`IntoReqwestLayer`](super::parts::IntoReqwestLayer). Classified and copied as
/// `http::Request`s are.
impl<B, E> Policy<Request<B>, reqwest::Response, E> for HttpPolicy
where
    B: CloneBody,
    E: AsStdError,
{
    fn classify(&self, request: &Request<B>, result: &Result<reqwest::Response, E>) -> Decision {
        self.allow_request_retry(classify_outcome(self, result), request)
    }

    fn clone_request(&self, request: &Request<B>) -> Option<Request<B>> {
        self.copy_request(request)
    }

    fn prepare_retry(&self, mut retry: PrepareRetry<'_, Request<B>, reqwest::Response, E>) {
        let attempt = retry.args().attempt() + 1;
        self.stamp_attempt(retry.request_mut().headers_mut(), attempt);
        discard(self, retry.into_replaced());
    }

    /// Lets out only a copy that may be repeated (an idempotent method, an
    /// `Idempotency-Key`), stamped with its attempt number like a retry.
    fn prepare_hedge(&self, copy: &mut Request<B>, attempt: u32) -> bool {
        if !self.may_repeat(copy.method(), copy.headers()) {
            return false;
        }
        self.stamp_attempt(copy.headers_mut(), attempt);
        copy.body_mut().mark_concurrent();
        true
    }
}

/// Statuses, delay headers and errors, as for hyper-util's responses.
fn classify_outcome<E: AsStdError>(
    policy: &HttpPolicy,
    result: &Result<reqwest::Response, E>,
) -> Decision {
    match result {
        Ok(response) => {
            policy.classify_parts(response.status(), response.headers(), response.extensions())
        }
        Err(error) => policy.classify_error(error.as_std_error()),
    }
}

fn discard<E>(policy: &HttpPolicy, result: Result<reqwest::Response, E>) {
    // As for hyper-util's responses: one `BufferBody` read whole has
    // nothing left to drain, and draining it would only spawn a task.
    if let Ok(response) = result {
        if !BufferedBytes::is_in(response.extensions()) {
            policy.discard_body(reqwest::Body::from(response));
        }
    }
}
