//! [`RecordedRequest`]: a `reqwest::Request` on its way through an
//! [`HttpRetry`](super::HttpRetry), its body recorded so it can be sent again.
//!
//! A type of its own, not an `http::Request`, so that the layer's inner
//! service can take it beside the `http::Request`s of hyper-util's client
//! without the two meanings of one request type clashing.

use std::task::{Context, Poll};

use ::http::Request;
use tower_backoff_core::policy::{Decision, Policy, PrepareRetry};
use tower_service::Service;

use super::buffer::{BufferBody, BufferReqwestFuture};
use super::error::AsStdError;
use super::policy::HttpPolicy;
use super::replay::ReplayBody;
use super::reqwest_replay::{attempt_body, record, ReqwestFuture};

/// A `reqwest::Request` turned into an `http::Request` whose body records
/// what it sends (up to the replay limit), as [`HttpRetry`](super::HttpRetry)
/// retries it; turned back into a `reqwest::Request` for each attempt.
#[derive(Debug)]
pub struct RecordedRequest(Request<ReplayBody<reqwest::Body>>);

impl RecordedRequest {
    /// Records `request`'s body up to `limit` bytes (a body already in
    /// memory whatever its size), or hands back reqwest's error when the
    /// request cannot be an `http::Request`.
    pub fn record(request: reqwest::Request, limit: usize) -> Result<Self, reqwest::Error> {
        let request = Request::<reqwest::Body>::try_from(request)?;
        Ok(Self(request.map(|body| record(body, limit))))
    }

    /// The recorded request.
    pub fn get_ref(&self) -> &Request<ReplayBody<reqwest::Body>> {
        &self.0
    }
}

impl<S> Service<RecordedRequest> for BufferBody<S>
where
    S: Service<reqwest::Request, Response = reqwest::Response>,
    S::Error: From<reqwest::Error>,
{
    type Response = reqwest::Response;
    type Error = S::Error;
    type Future = ReqwestFuture<BufferReqwestFuture<S::Future>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Service::<reqwest::Request>::poll_ready(self, cx)
    }

    fn call(&mut self, request: RecordedRequest) -> Self::Future {
        match reqwest::Request::try_from(request.0.map(attempt_body)) {
            Ok(request) => ReqwestFuture::called(Service::<reqwest::Request>::call(self, request)),
            Err(error) => ReqwestFuture::failed(error.into()),
        }
    }
}

/// As for the `http::Request` inside.
impl<E> Policy<RecordedRequest, reqwest::Response, E> for HttpPolicy
where
    E: AsStdError,
{
    fn classify(
        &self,
        request: &RecordedRequest,
        result: &Result<reqwest::Response, E>,
    ) -> Decision {
        Policy::<Request<ReplayBody<reqwest::Body>>, _, _>::classify(self, &request.0, result)
    }

    fn clone_request(&self, request: &RecordedRequest) -> Option<RecordedRequest> {
        self.copy_request(&request.0).map(RecordedRequest)
    }

    fn prepare_retry(&self, retry: PrepareRetry<'_, RecordedRequest, reqwest::Response, E>) {
        let (request, replaced, args) = retry.into_parts();
        let inner = PrepareRetry::new(&mut request.0, replaced, args);
        Policy::<Request<ReplayBody<reqwest::Body>>, _, _>::prepare_retry(self, inner);
    }

    fn prepare_hedge(&self, copy: &mut RecordedRequest, attempt: u32) -> bool {
        Policy::<Request<ReplayBody<reqwest::Body>>, reqwest::Response, E>::prepare_hedge(
            self,
            &mut copy.0,
            attempt,
        )
    }
}
