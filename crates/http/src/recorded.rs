//! [`RecordedRequest`]: a `reqwest::Request` on its way through an
//! [`HttpRetry`](super::HttpRetry), its body recorded so it can be sent again.
//!
//! A type of its own, not an `http::Request`, so that the layer's inner
//! service can take it beside the `http::Request`s of hyper-util's client
//! without the two meanings of one request type clashing. It stays a
//! `reqwest::Request`: turning one into an `http::Request` and back costs
//! a URL printed and parsed again on every attempt, which on loopback is a
//! good part of the whole request.

use std::task::{Context, Poll};

use bytes::Bytes;
use tower_backoff_core::policy::{Decision, Policy, PrepareRetry};
use tower_service::Service;

use super::body::{unless_spent, CloneBody};
use super::buffer::{BufferBody, BufferReqwestFuture};
use super::error::AsStdError;
use super::policy::HttpPolicy;
use super::replay::ReplayBody;
use super::reqwest_replay::take_in_memory;

/// A `reqwest::Request` whose body records what it sends (up to the replay
/// limit), as [`HttpRetry`](super::HttpRetry) retries it; each attempt gets
/// the request with a copy of the body.
#[derive(Debug)]
pub struct RecordedRequest {
    /// The request, its body taken out into `body`.
    head: reqwest::Request,
    body: Recorded,
}

#[derive(Debug)]
enum Recorded {
    /// No body at all (a GET): nothing to record.
    Empty,
    /// A body reqwest held in memory, sent as these bytes each time, so that
    /// reqwest can follow a 307 or 308 redirect with it as without the layer.
    Bytes(Bytes),
    /// A stream, recorded as it is sent, up to the limit.
    Stream(ReplayBody<reqwest::Body>),
}

impl RecordedRequest {
    /// Records `request`'s body up to `limit` bytes (a body already in
    /// memory whatever its size). A request without a body records nothing.
    pub fn record(mut request: reqwest::Request, limit: usize) -> Self {
        let body = match request.body_mut().take() {
            None => Recorded::Empty,
            Some(mut body) => match take_in_memory(&mut body) {
                Some(bytes) => Recorded::Bytes(bytes),
                None => Recorded::Stream(ReplayBody::with_limit(body, limit)),
            },
        };
        Self {
            head: request,
            body,
        }
    }

    /// The request without its body: method, URL, headers, extensions.
    pub fn get_ref(&self) -> &reqwest::Request {
        &self.head
    }

    /// The request one attempt sends: the head, and its body's copy.
    fn into_attempt(self) -> reqwest::Request {
        let mut request = self.head;
        *request.body_mut() = match self.body {
            Recorded::Empty => None,
            Recorded::Bytes(bytes) => Some(reqwest::Body::from(bytes)),
            Recorded::Stream(body) => Some(reqwest::Body::wrap(body)),
        };
        request
    }
}

impl<S> Service<RecordedRequest> for BufferBody<S>
where
    S: Service<reqwest::Request, Response = reqwest::Response>,
    S::Error: From<reqwest::Error>,
{
    type Response = reqwest::Response;
    type Error = S::Error;
    type Future = BufferReqwestFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Service::<reqwest::Request>::poll_ready(self, cx)
    }

    fn call(&mut self, request: RecordedRequest) -> Self::Future {
        Service::<reqwest::Request>::call(self, request.into_attempt())
    }
}

/// As for an `http::Request` with the same method, headers and body.
impl<E> Policy<RecordedRequest, reqwest::Response, E> for HttpPolicy
where
    E: AsStdError,
{
    fn classify(
        &self,
        request: &RecordedRequest,
        result: &Result<reqwest::Response, E>,
    ) -> Decision {
        let decision = Policy::<reqwest::Request, _, _>::classify(self, &request.head, result);
        match &request.body {
            Recorded::Stream(body) => unless_spent(decision, body),
            Recorded::Empty | Recorded::Bytes(_) => decision,
        }
    }

    fn clone_request(&self, request: &RecordedRequest) -> Option<RecordedRequest> {
        if !self.may_retry(request.head.method(), request.head.headers()) {
            return None;
        }
        let body = match &request.body {
            Recorded::Empty => Recorded::Empty,
            Recorded::Bytes(bytes) => Recorded::Bytes(bytes.clone()),
            Recorded::Stream(body) => Recorded::Stream(body.clone_body()?),
        };
        Some(RecordedRequest {
            // Without its body, the request always clones.
            head: request.head.try_clone()?,
            body,
        })
    }

    fn prepare_retry(&self, retry: PrepareRetry<'_, RecordedRequest, reqwest::Response, E>) {
        let (request, replaced, args) = retry.into_parts();
        let inner = PrepareRetry::new(&mut request.head, replaced, args);
        Policy::<reqwest::Request, _, _>::prepare_retry(self, inner);
    }

    fn prepare_hedge(&self, copy: &mut RecordedRequest, attempt: u32) -> bool {
        let hedged = Policy::<reqwest::Request, reqwest::Response, E>::prepare_hedge(
            self,
            &mut copy.head,
            attempt,
        );
        if let (true, Recorded::Stream(body)) = (hedged, &mut copy.body) {
            body.mark_concurrent();
        }
        hedged
    }
}
