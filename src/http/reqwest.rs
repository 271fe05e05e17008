//! [`HttpPolicy`] for `reqwest::Client`, which is a tower `Service` of
//! `reqwest::Request`.

use std::time::Duration;

use super::error::AsStdError;
use super::info::RetryInfo;
use super::policy::HttpPolicy;
use crate::policy::{Decision, Policy};

/// Classifies `reqwest` outcomes as it does `http` ones: statuses and
/// `Retry-After` the same way, errors by `is_timeout()` / `is_connect()` and
/// their `source()` chain. Requests are copied with
/// [`reqwest::Request::try_clone`], so a streaming body goes out once.
///
/// ```
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
        _request: &reqwest::Request,
        result: &Result<reqwest::Response, E>,
    ) -> Decision {
        match result {
            Ok(response) => self.classify_response(response.status(), response.headers()),
            Err(error) => self.classify_error(error.as_std_error()),
        }
    }

    fn clone_request(&self, request: &reqwest::Request) -> Option<reqwest::Request> {
        if !self.may_repeat(request.method(), request.headers()) {
            return None;
        }
        request.try_clone()
    }

    fn discard(&self, result: Result<reqwest::Response, E>) {
        if let Ok(response) = result {
            self.discard_body(reqwest::Body::from(response));
        }
    }

    fn finish(&self, result: &mut Result<reqwest::Response, E>, attempts: u32, slept: Duration) {
        if let (Ok(response), true) = (result, self.records_info()) {
            response
                .extensions_mut()
                .insert(RetryInfo::new(attempts, slept));
        }
    }

    fn prepare_retry(&self, request: &mut reqwest::Request, attempt: u32) {
        self.stamp_attempt(request.headers_mut(), attempt);
    }
}
