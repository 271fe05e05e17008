//! [`Backoff`], the tower `Service` that retries its inner service.

use std::fmt;
use std::task::{ready, Context, Poll};

use tower_service::Service;

use crate::adaptive::Gate;
use crate::config::Config;
use crate::future::ResponseFuture;
use crate::layer::BackoffLayer;
use crate::policy::{Policy, RetryOnError};
use crate::schedule::{Exponential, Schedule};
use crate::stats::Event;

/// Retries requests to `S` that policy `P` classifies as transient failures,
/// sleeping between attempts as schedule `Sch` and its jitter say.
///
/// Built by [`BackoffLayer`]. Cloning it clones the inner service and copies the
/// configuration; clones share the layer's budget, pacing and stats. Each
/// response future holds its own clone, on which it calls `poll_ready` before
/// every retry.
///
/// With [pacing](crate::AdaptivePacing) on, `poll_ready` waits for this
/// clone's turn to send before it asks the inner service, so pacing is
/// backpressure: the service the caller readied sends the first attempt, and
/// nothing is reserved from the inner service while pacing waits.
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
    gate: Gate,
}

impl<S, P: Clone, Sch: Clone> Backoff<S, P, Sch> {
    /// Wraps `inner` with `layer`'s configuration.
    pub fn new(inner: S, layer: &BackoffLayer<P, Sch>) -> Self {
        tower_layer::Layer::layer(layer, inner)
    }
}

impl<S, P, Sch> Backoff<S, P, Sch> {
    pub(crate) fn from_config(inner: S, config: Config<P, Sch>) -> Self {
        Self {
            inner,
            config,
            gate: Gate::default(),
        }
    }

    pub(crate) fn config(&self) -> &Config<P, Sch> {
        &self.config
    }

    /// Readiness to send an attempt, first or retry: this clone's turn under
    /// pacing, then the inner service's readiness.
    #[inline]
    pub(crate) fn poll_ready_to_send<Req>(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), S::Error>>
    where
        S: Service<Req>,
    {
        // Pacing first: waiting for a send slot while holding whatever the
        // inner service reserved (a concurrency permit) could starve it.
        if let Some(pacing) = self.config.pacing() {
            let config = &self.config;
            ready!(pacing.poll_send(&mut self.gate, cx, || config.new_rng()));
        }
        self.inner.poll_ready(cx)
    }

    /// Sends attempt number `attempt` through the inner service, which
    /// `poll_ready` readied; returns its future and its pacing stamp.
    #[inline]
    pub(crate) fn send<Req>(&mut self, request: Req, attempt: u32) -> (S::Future, u16)
    where
        S: Service<Req>,
    {
        let mut stamp = 0;
        if let Some(shared) = self.config.shared.as_deref() {
            shared.on_send(attempt);
            if let Some(pacing) = &shared.pacing {
                stamp = pacing.sent(&mut self.gate);
            }
        }
        (self.inner.call(request), stamp)
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
        self.poll_ready_to_send(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.config.record(Event::Request);
        let spare = self.config.policy.clone_request(&request);
        let (future, stamp) = self.send(request, 1);
        ResponseFuture::new(future, stamp, spare, self.clone())
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
