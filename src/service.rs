//! [`Backoff`], the tower `Service` that retries its inner service.

use std::fmt;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::future::ResponseFuture;
use crate::layer::{BackoffLayer, Config};
use crate::policy::{Policy, RetryOnError};
use crate::schedule::{Exponential, Schedule};
use crate::stats::Event;

/// Retries requests to `S` that policy `P` classifies as transient failures,
/// sleeping between attempts as schedule `Sch` and its jitter say.
///
/// Built by [`BackoffLayer`]. Cloning it clones the inner service and copies the
/// configuration; clones share the layer's budget, pacing and stats. Each
/// response future holds its own clone, on which it calls `poll_ready` before
/// every retry, and before a first attempt that waited for pacing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower::{service_fn, ServiceExt};
/// use tower_backoff::{Backoff, BackoffLayer};
///
/// let echo = service_fn(|s: String| async move { Ok::<_, std::io::Error>(s) });
/// let svc = Backoff::new(echo, &BackoffLayer::new());
/// assert_eq!(svc.oneshot("hi".to_string()).await.unwrap(), "hi");
/// # }
/// ```
#[derive(Clone)]
pub struct Backoff<S, P = RetryOnError, Sch = Exponential> {
    inner: S,
    config: Config<P, Sch>,
}

impl<S, P: Clone, Sch: Clone> Backoff<S, P, Sch> {
    /// Wraps `inner` with `layer`'s configuration.
    pub fn new(inner: S, layer: &BackoffLayer<P, Sch>) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }
}

impl<S, P, Sch> Backoff<S, P, Sch> {
    pub(crate) fn from_config(inner: S, config: Config<P, Sch>) -> Self {
        Self { inner, config }
    }

    pub(crate) fn config(&self) -> &Config<P, Sch> {
        &self.config
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, P, Sch, Req> Service<Req> for Backoff<S, P, Sch>
where
    S: Service<Req> + Clone,
    P: Policy<Req, S::Response, S::Error> + Clone,
    Sch: Schedule + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, P, Sch, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        if let Some(shared) = self.config.shared.as_deref() {
            shared.record(Event::Request);
            if shared.pacing.as_ref().is_some_and(|p| p.now().0 != 0) {
                // The first attempt waits for pacing, then goes out through the
                // future's clone, readied after the pause.
                return ResponseFuture::paced(request, self.clone());
            }
            shared.on_send(1);
        }
        let spare = self.config.policy.clone_request(&request);
        // `inner` was readied by our `poll_ready`; the future's clone is readied
        // again before each retry.
        let future = self.inner.call(request);
        ResponseFuture::new(future, spare, self.clone())
    }
}

impl<S: fmt::Debug, P, Sch: fmt::Debug> fmt::Debug for Backoff<S, P, Sch> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
