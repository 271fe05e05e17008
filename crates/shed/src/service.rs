//! [`Shed`]: the service that admits or rejects each request.

use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use tower_service::Service;

use crate::body::ShedBody;
use crate::criticality::{is_retry, Criticality, Priority};
use crate::future::ResponseFuture;
use crate::layer::Answers;
use crate::limiter::Limiter;

/// Admits each request to the inner service when the [`Limiter`] has room
/// for its [`Priority`], and otherwise answers at once, without calling it:
/// an HTTP 503 (or 429) with a spread `Retry-After`, or for a gRPC request
/// (`content-type: application/grpc…`) a trailers-only status with
/// `grpc-retry-pushback-ms`.
///
/// Readiness is the inner service's. A rejected request does not use the
/// readiness it was given, as with tower's `LoadShed`.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{service_fn, ServiceBuilder, ServiceExt};
/// use tower_backoff::shed::ShedLayer;
///
/// let server = ServiceBuilder::new()
///     .layer(ShedLayer::builder().build()?)
///     .service(service_fn(|_req: Request<Full<Bytes>>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("hello"))))
///     }));
/// let response = server.oneshot(Request::new(Full::new(Bytes::new()))).await?;
/// assert_eq!(response.status(), 200);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    limiter: Limiter,
    answers: Answers,
}

impl<S> Shed<S> {
    pub(crate) fn new(inner: S, limiter: Limiter, answers: Answers) -> Self {
        Self {
            inner,
            limiter,
            answers,
        }
    }

    /// The limiter it admits by.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Shed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body,
{
    type Response = Response<ShedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let priority = if self.answers.trust_criticality {
            Priority::from_headers(request.headers())
        } else {
            Priority::new(Criticality::Default, is_retry(request.headers()))
        };
        let now = tokio::time::Instant::now().into_std();
        match self.limiter.try_acquire(priority, now) {
            Ok(permit) => ResponseFuture::admitted(self.inner.call(request), permit),
            Err(rejection) => {
                let grpc = request
                    .headers()
                    .get(CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                let response = if grpc {
                    let code = if rejection.should_retry() {
                        self.answers.grpc_retry
                    } else {
                        self.answers.grpc_stop
                    };
                    rejection.grpc_response::<()>(code)
                } else {
                    rejection.http_response::<()>(self.answers.status)
                };
                ResponseFuture::rejected(response.map(|()| ShedBody::empty()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{service_fn, Layer, ServiceExt};

    use crate::{Limiter, Priority, ShedLayer};

    /// The status a request marked `criticality` gets with 9 of 10 places
    /// held, from a layer that trusts the header or not.
    async fn status(trust: bool, criticality: &str) -> u16 {
        let limiter = Limiter::builder()
            .initial_limit(10)
            .max_limit(10)
            .seed(1)
            .build()
            .unwrap();
        let _held: Vec<_> = (0..9)
            .map(|_| {
                limiter
                    .try_acquire(Priority::HIGHEST, Instant::now())
                    .unwrap()
            })
            .collect();
        let server = ShedLayer::builder()
            .shared_limiter(limiter)
            .trust_criticality(trust)
            .build()
            .unwrap()
            .layer(service_fn(|_req: http::Request<Full<Bytes>>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
            }));
        let request = http::Request::get("/")
            .header("x-criticality", criticality)
            .body(Full::new(Bytes::new()))
            .unwrap();
        server.oneshot(request).await.unwrap().status().as_u16()
    }

    #[tokio::test]
    async fn x_criticality_ranks_a_request_only_where_it_is_trusted() {
        // Trusted, `critical` takes the last place default work may not.
        assert_eq!(status(true, "critical").await, 200);
        assert_eq!(status(true, "default").await, 503);
        // Not trusted, every request is default work.
        assert_eq!(status(false, "critical").await, 503);
    }
}
