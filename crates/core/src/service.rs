//! [`BackoffRetry`], the tower `Service` that retries its inner service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tower_layer::Layer;
use tower_service::Service;

use crate::adaptive::Gate;
use crate::breaker::{Admission, BreakerOpen, BreakerState};
use crate::clone_for_retries::CloneForRetries;
use crate::config::Config;
use crate::deadline::{AttemptTimer, NoTimeout};
use crate::decision::Decision;
use crate::events::{Event, RejectArgs};
use crate::future::ResponseFuture;
use crate::policy::{ClassifyFn, Policy, RetryIf, RetryLimits, RetryOnError};
use crate::send::{pacing_stamp, poll_ready_to_send};
use crate::transitions::{Attempt, RequestLimits};

/// Retries requests to `S` that policy `P` classifies as transient failures,
/// sleeping between attempts as the layer's schedule and jitter say.
///
/// Built by [`BackoffLayer`](crate::BackoffLayer). Cloning it clones the inner service and shares
/// the configuration, with the layer's budget, pacing and stats. Each response
/// future holds its own clone of the inner service, which it readies (after
/// its turn under pacing) before every retry.
///
/// With [pacing](crate::AdaptivePacing) on, `poll_ready` waits for this
/// clone's turn to send before it asks the inner service, so pacing is
/// backpressure: the service the caller readied sends the first attempt, and
/// nothing is reserved from the inner service while pacing waits.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower::{service_fn, ServiceExt};
/// use tower_backoff::{BackoffRetry, BackoffLayer};
///
/// let echo = service_fn(|s: String| async move { Ok::<_, std::io::Error>(s) });
/// let svc = BackoffRetry::new(echo, &BackoffLayer::new());
/// assert_eq!(svc.oneshot("hi".to_string()).await.unwrap(), "hi");
/// # }
/// ```
///
/// `T` says how long an attempt may take: `NoTimeout` (the default; the
/// error is the inner service's) or, with
/// [`attempt_timeout`](crate::BackoffBuilder::attempt_timeout), a limit per
/// attempt (the error is [`Error`](crate::Error)).
pub struct BackoffRetry<S, P = RetryOnError, T = NoTimeout> {
    inner: S,
    config: Arc<Config<P, T>>,
    gate: Gate,
}

impl<S: Clone, P, T> Clone for BackoffRetry<S, P, T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
            gate: Gate::default(),
        }
    }
}

impl<S, P, T> BackoffRetry<S, P, T> {
    /// Wraps `inner` with `layer`'s configuration: a
    /// [`BackoffLayer`](crate::BackoffLayer)'s, or that of any layer that makes
    /// this service.
    pub fn new<L: Layer<S, Service = Self>>(inner: S, layer: &L) -> Self {
        layer.layer(inner)
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config<P, T>>) -> Self {
        Self {
            inner,
            config,
            gate: Gate::default(),
        }
    }

    /// Retries when `predicate(&outcome)` is true, as [`retry_if`](crate::retry_if)
    /// does, with the closure's argument type learnt from the service: no
    /// annotation needed.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use tower::{service_fn, ServiceExt};
    /// use tower_backoff::{BackoffRetry, BackoffLayer};
    ///
    /// let flaky = service_fn(|path: &'static str| async move {
    ///     Err::<String, _>(std::io::Error::new(std::io::ErrorKind::TimedOut, path))
    /// });
    /// let svc = BackoffRetry::new(flaky, &BackoffLayer::new())
    ///     .retry_if(|outcome| matches!(outcome, Err(e) if e.kind() == std::io::ErrorKind::TimedOut));
    /// assert!(svc.oneshot("/status").await.is_err());
    /// # }
    /// ```
    pub fn retry_if<Req, F>(self, predicate: F) -> BackoffRetry<S, RetryIf<F>, T>
    where
        P: Clone,
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
        F: Fn(&Result<S::Response, T::Error>) -> bool,
    {
        self.with_policy(|_| crate::retry_if(predicate))
    }

    /// Decides each outcome with `classify(&request, &outcome)`, as
    /// [`classify_fn`](crate::classify_fn) does, with the argument types learnt
    /// from the service.
    ///
    /// ```
    /// # extern crate tower_backoff_core as tower_backoff;
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use tower::{service_fn, ServiceExt};
    /// use tower_backoff::{BackoffRetry, BackoffLayer, Cause, Decision};
    ///
    /// let store = service_fn(|key: u32| async move { Ok::<u16, std::io::Error>(200 + key as u16) });
    /// let svc = BackoffRetry::new(store, &BackoffLayer::new()).classify(|key, outcome| match outcome {
    ///     Ok(429) => Decision::retry_after(Duration::from_secs(1)).because(Cause::Throttled),
    ///     Ok(_) => Decision::Success,
    ///     Err(e) if *key == 0 && e.kind() == std::io::ErrorKind::ConnectionRefused => {
    ///         Decision::retry()
    ///     }
    ///     Err(_) => Decision::Final,
    /// });
    /// assert_eq!(svc.oneshot(1).await.unwrap(), 201);
    /// # }
    /// ```
    pub fn classify<Req, F>(self, classify: F) -> BackoffRetry<S, ClassifyFn<F>, T>
    where
        P: Clone,
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
        F: Fn(&Req, &Result<S::Response, T::Error>) -> Decision,
    {
        self.with_policy(|_| crate::classify_fn(classify))
    }

    fn with_policy<P2>(self, change: impl FnOnce(P) -> P2) -> BackoffRetry<S, P2, T>
    where
        P: Clone,
        T: Clone,
    {
        // The settings are shared with the layer's other services: this one
        // gets its own copy, with the same budget, pacing and stats.
        let config = Arc::unwrap_or_clone(self.config).map_policy(change);
        BackoffRetry {
            inner: self.inner,
            config: Arc::new(config),
            gate: self.gate,
        }
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

impl<S, P, T, Req> Service<Req> for BackoffRetry<S, P, T>
where
    S: Service<Req> + CloneForRetries,
    T: AttemptTimer<S::Error>,
    P: Policy<Req, S::Response, T::Error>,
    S::Response: 'static,
    T::Error: 'static,
{
    type Response = S::Response;
    type Error = T::Error;
    type Future = ResponseFuture<S, P, Req, T>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        poll_ready_to_send(&mut self.inner, &mut self.gate, &self.config, cx).map_err(T::inner)
    }

    #[inline]
    fn call(&mut self, request: Req) -> Self::Future {
        self.call_with(request, None)
    }
}

impl<S, P, T> BackoffRetry<S, P, T> {
    /// Calls the service with `limits` for this one request instead of the
    /// layer's: how a front-end passes a caller's per-request
    /// [`RetryLimits`] (the HTTP layer reads them from the request's
    /// extensions). As `Service::call`, it needs
    /// [`poll_ready`](Service::poll_ready) first.
    pub fn call_with_limits<Req>(
        &mut self,
        request: Req,
        limits: RetryLimits,
    ) -> ResponseFuture<S, P, Req, T>
    where
        S: Service<Req> + Clone,
        T: AttemptTimer<S::Error>,
        P: Policy<Req, S::Response, T::Error>,
        S::Response: 'static,
        T::Error: 'static,
    {
        self.call_with(request, Some(limits))
    }

    #[inline(always)]
    fn call_with<Req>(
        &mut self,
        request: Req,
        own: Option<RetryLimits>,
    ) -> ResponseFuture<S, P, Req, T>
    where
        S: Service<Req> + Clone,
        T: AttemptTimer<S::Error>,
        P: Policy<Req, S::Response, T::Error>,
        S::Response: 'static,
        T::Error: 'static,
    {
        let config = &*self.config;
        if let Some(breaker) = config.breaker() {
            match breaker.admit() {
                Admission::Closed => {}
                Admission::Probe(probe) => {
                    if probe.opened_half() {
                        config.emit(|| Event::Breaker(BreakerState::HalfOpen));
                    }
                }
                Admission::Rejected => return self.reject(),
            }
        }
        // Only a request with limits of its own, a deadline, a pacing stamp or
        // hedges is tracked from the call: its first outcome already needs them.
        let tracked = own.is_some() || config.track_from_call;
        let limits = tracked.then(|| {
            let own = own.unwrap_or_default();
            RequestLimits {
                max_attempts: own.max_attempts.unwrap_or(config.max_attempts),
                deadline: deadline(config.max_elapsed, own.deadline),
            }
        });
        // Kept for classifying every outcome, the last one's too, and for
        // the transparent retry that may follow even the last attempt.
        let spare = config.policy.clone_request(&request);
        let timer = config
            .timeouts
            .timer(limits.and_then(|limits| limits.deadline));
        config.on_call();
        let Some(limits) = limits else {
            // No pacing either (it tracks from the call): no stamp to take.
            debug_assert!(config.pacing().is_none(), "pacing tracks from the call");
            let future = self.inner.call(request);
            let inner = self.inner.clone();
            return ResponseFuture::untracked(
                future,
                timer,
                spare,
                inner,
                Arc::clone(&self.config),
            );
        };
        let stamp = pacing_stamp(config, &mut self.gate);
        let future = self.inner.call(request);
        let attempt = Attempt {
            future,
            timer,
            stamp,
        };
        let inner = self.inner.clone();
        ResponseFuture::tracked_from_call(attempt, spare, limits, inner, Arc::clone(&self.config))
    }
}

impl<S, P, T> BackoffRetry<S, P, T> {
    /// A request the open breaker rejected: nothing sent, no budget, no
    /// `Called`; its future returns the breaker's error.
    #[inline(always)]
    fn reject<Req>(&mut self) -> ResponseFuture<S, P, Req, T>
    where
        S: Service<Req> + Clone,
        T: AttemptTimer<S::Error>,
    {
        let error = self.rejection::<S::Error>();
        ResponseFuture::rejected(error, self.inner.clone(), Arc::clone(&self.config))
    }

    /// Tells the observers of a rejection and makes its error.
    fn rejection<E>(&self) -> T::Error
    where
        T: AttemptTimer<E>,
    {
        self.config.emit(|| Event::Rejected(RejectArgs::first()));
        // A breaker is set only where the error can say it rejected.
        T::rejected(BreakerOpen).expect("a layer with a breaker can reject")
    }
}

/// When a request called now must end: `max_elapsed` from now, or the
/// caller's own deadline, whichever is sooner. Reads the clock only when a
/// time limit is configured.
fn deadline(max_elapsed: Option<Duration>, requested: Option<Instant>) -> Option<Instant> {
    let own = max_elapsed.and_then(|limit| Instant::now().checked_add(limit));
    match (own, requested) {
        (Some(own), Some(requested)) => Some(own.min(requested)),
        (own, requested) => own.or(requested),
    }
}

impl<S: fmt::Debug, P, T: fmt::Debug> fmt::Debug for BackoffRetry<S, P, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackoffRetry")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
