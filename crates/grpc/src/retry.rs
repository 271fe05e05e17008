//! [`GrpcRetryLayer`]: retries for a tonic channel, configured per method
//! from a gRPC service config.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::{Request, Response};
use bytes::Bytes;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::committed::{Committed, GrpcBody};
use super::policy::{GrpcPolicy, TransparentRetry};
use super::replay::TonicBody;
use super::retry_config::RetryConfig;
use super::service_config::{MethodPolicy, ServiceConfig};
use super::throttle::{RetryThrottle, ThrottleGate};
use super::timeout::{parse_grpc_timeout, CallDeadline};
use tower_backoff_core::budget::{Budget, TokenBucket};
use tower_backoff_core::deadline::NoTimeout;
use tower_backoff_core::error::ConfigError;
use tower_backoff_core::BackoffLayer;
use tower_backoff_core::BackoffRetry;
use tower_backoff_core::CloneForRetries;
use tower_backoff_core::RetryLimits;
use tower_backoff_core::Stats;
use tower_backoff_http::{AsStdError, HttpResponseFuture, ReplayBody, DEFAULT_REPLAY_LIMIT};

type BoxError = Box<dyn Error + Send + Sync>;

/// Wraps a tonic `Channel` (or any service of `http::Request<tonic::body::Body>`)
/// so that every call is retried as the service config says for its method.
///
/// Each call is routed by its path (`/package.Service/Method`) to its
/// method's own [`BackoffRetry`]: that method's [`RetryConfig`] (attempts, backoff,
/// codes) or [`HedgingConfig`](super::HedgingConfig) (copies, delay,
/// non-fatal codes) with a [`GrpcPolicy`]. Methods the config gives neither
/// are not retried, except for A6's transparent retry of a call that never
/// left the client. Every method of the channel shares one budget: the
/// config's `retryThrottling` as a [`RetryThrottle`] if it has one (counted
/// by each method's policy, so every attempt counts, as A6 says), else the
/// crate's default ([`TokenBucket::fleet_safe`], for the most attempts any
/// method allows); [`budget`](GrpcRetryBuilder::budget)
/// replaces either. A call's `grpc-timeout` is its deadline across every
/// attempt and hedge: each carries the time left, and none starts whose
/// backoff would end past it (see the crate docs for what a call whose
/// deadline stops its retry returns). Request bodies are recorded up to
/// [`replay_limit`](GrpcRetryBuilder::replay_limit) bytes per call; a call
/// that sends more is committed and not retried.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tonic::transport::Channel;
/// use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
/// use tower_backoff::grpc::{GrpcRetryLayer, ServiceConfig};
///
/// let config: ServiceConfig = r#"{"methodConfig": [{
///     "name": [{"service": "grpc.health.v1.Health"}],
///     "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#.parse()?;
///
/// let channel = Channel::from_static("http://127.0.0.1:50051").connect_lazy();
/// let channel = tower::ServiceBuilder::new()
///     .layer(GrpcRetryLayer::new(&config)?)
///     .service(channel);
/// let mut client = HealthClient::new(channel);
/// let reply = client.check(HealthCheckRequest { service: String::new() }).await?;
/// # drop(reply);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct GrpcRetryLayer {
    routes: Arc<Routes>,
    replay_limit: usize,
    record_info: bool,
}

struct Routes {
    config: ServiceConfig,
    /// One per `methodConfig`, in document order.
    methods: Vec<BackoffLayer<GrpcPolicy>>,
    /// For methods no `methodConfig` matches, or matches without a retry
    /// policy: the transparent retry only.
    unconfigured: BackoffLayer<GrpcPolicy>,
    throttle: Option<Arc<RetryThrottle>>,
}

impl GrpcRetryLayer {
    /// A layer with `config`'s settings, its budget and the default replay
    /// limit.
    ///
    /// # Errors
    /// None in practice (a parsed config is valid); a [`ConfigError`] if a
    /// method's layer cannot be built.
    pub fn new(config: &ServiceConfig) -> Result<Self, ConfigError> {
        Self::builder(config).build()
    }

    /// A builder starting from `config`.
    pub fn builder(config: &ServiceConfig) -> GrpcRetryBuilder {
        GrpcRetryBuilder {
            config: config.clone(),
            replay_limit: DEFAULT_REPLAY_LIMIT,
            budget: None,
            stats: None,
            max_elapsed: None,
            record_info: true,
            hedge_load_cap: None,
        }
    }

    /// The throttle every method shares, when the config has
    /// `retryThrottling` and no other budget was given.
    pub fn throttle(&self) -> Option<&Arc<RetryThrottle>> {
        self.routes.throttle.as_ref()
    }

    /// The layer calls to `path` get.
    fn route(&self, path: &str) -> &BackoffLayer<GrpcPolicy> {
        route(&self.routes, path)
    }
}

fn route<'a>(routes: &'a Routes, path: &str) -> &'a BackoffLayer<GrpcPolicy> {
    match routes.config.entry(path) {
        Some(index) if routes.config.policies()[index].is_some() => &routes.methods[index],
        _ => &routes.unconfigured,
    }
}

impl fmt::Debug for GrpcRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcRetryLayer")
            .field("config", &self.routes.config)
            .field("replay_limit", &self.replay_limit)
            .finish_non_exhaustive()
    }
}

/// Builds a [`GrpcRetryLayer`].
#[must_use]
pub struct GrpcRetryBuilder {
    config: ServiceConfig,
    replay_limit: usize,
    budget: Option<Arc<dyn Budget>>,
    stats: Option<Stats>,
    max_elapsed: Option<Duration>,
    record_info: bool,
    hedge_load_cap: Option<f64>,
}

impl GrpcRetryBuilder {
    /// The share of a hedged method's calls, in any second, that may get a
    /// hedge (in (0, 1]; default 0.1, the core's
    /// [`Hedging::max_extra_load`](tower_backoff_core::Hedging::max_extra_load)).
    ///
    /// The calls counted are those of the last second, the hedged call
    /// itself included (from when it is found pending): a method may send
    /// `share × calls` hedges in any second, rounded down. So at 1.0 the
    /// first call after an idle second gets one hedge, never a third copy,
    /// while its method's other recent calls leave room for more; at the
    /// default 0.1 it gets none until ten calls came in the second. A hedge
    /// the cap refuses asks again while its call is pending. The cap bounds
    /// hedges only: when every copy in flight failed, the next goes out at
    /// once as a retry, paid from the budget.
    ///
    /// gRFC A6 has no such cap and sends every copy `hedgingDelay` apart;
    /// 1.0 comes closest. The default keeps hedging from piling load on a
    /// server that is slow for everyone.
    pub fn hedge_load_cap(mut self, share: f64) -> Self {
        self.hedge_load_cap = Some(share);
        self
    }

    /// Stops adding [`RetryInfo`](tower_backoff_http::RetryInfo) to
    /// responses (it costs one small allocation per call).
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// Time limit for every call, from its first attempt: no retry starts
    /// whose sleep would end past it. A call's own deadline, its
    /// `grpc-timeout` (tonic's `Request::set_timeout`), spans its attempts
    /// too; the sooner of the two applies.
    pub fn max_elapsed(mut self, limit: Duration) -> Self {
        self.max_elapsed = Some(limit);
        self
    }

    /// Most request-body bytes recorded per call (default
    /// [`DEFAULT_REPLAY_LIMIT`]): A6's per-call buffer limit, the client's
    /// choice rather than the service config's. A call that sends more is
    /// committed: not retried.
    pub fn replay_limit(mut self, bytes: usize) -> Self {
        self.replay_limit = bytes;
        self
    }

    /// Caps every method's retries with `budget` instead of the config's
    /// throttling or the default budget. Pass an `Arc` to share it further.
    pub fn budget(mut self, budget: impl Budget + 'static) -> Self {
        self.budget = Some(Arc::new(budget));
        self
    }

    /// Counts every method's requests, attempts and retries into `stats`.
    pub fn stats(mut self, stats: Stats) -> Self {
        self.stats = Some(stats);
        self
    }

    /// Builds one [`BackoffRetry`] layer per method config, sharing the budget.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `max_elapsed` when it is zero or longer than
    /// a year, or `hedge_load_cap` when it is not in (0, 1].
    pub fn build(self) -> Result<GrpcRetryLayer, ConfigError> {
        if let Some(share) = self.hedge_load_cap {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::new(
                    "hedge_load_cap",
                    format!("must be in (0, 1], got {share}"),
                ));
            }
        }
        let throttle = match (&self.budget, self.config.retry_throttling()) {
            (None, Some(throttling)) => Some(Arc::new(throttling.throttle())),
            _ => None,
        };
        // A6's throttling is counted by the policy, which sees every
        // attempt; then the layer needs no other budget.
        let budget: Option<Arc<dyn Budget>> = match (self.budget, &throttle) {
            (Some(budget), _) => Some(budget),
            (None, Some(_)) => None,
            // The core's default, sized to the longest method's retries, so
            // that no method's first failing call is cut short.
            (None, None) => {
                let most = self
                    .config
                    .policies()
                    .iter()
                    .flatten()
                    .map(|method| match method {
                        MethodPolicy::Retry(retry) => retry.max_attempts(),
                        MethodPolicy::Hedging(hedging) => hedging.max_attempts(),
                    });
                let attempts = most
                    .max()
                    .unwrap_or(RetryConfig::transparent_only().max_attempts());
                Some(Arc::new(TokenBucket::fleet_safe(attempts)))
            }
        };
        let build = |method: Option<&MethodPolicy>| {
            let transparent_only = RetryConfig::transparent_only();
            let (builder, mut policy, mut budget) = match method {
                Some(MethodPolicy::Hedging(hedging)) => {
                    let mut builder = hedging.layer();
                    if let Some(share) = self.hedge_load_cap {
                        builder = builder.hedge(hedging.hedging().max_extra_load(share));
                    }
                    // The policy counts the throttle; the layer reads it to
                    // stop hedges and the copy after failed ones.
                    let gate = throttle
                        .as_ref()
                        .map(|t| Arc::new(ThrottleGate(Arc::clone(t))) as Arc<dyn Budget>);
                    (builder, hedging.policy(), budget.clone().or(gate))
                }
                // One type for every method's layer: hedging ones have room
                // to hedge, so all have (8 bytes a response future).
                Some(MethodPolicy::Retry(retry)) => (retry.layer(), retry.policy(), budget.clone()),
                None => (
                    transparent_only.layer(),
                    transparent_only.policy(),
                    budget.clone(),
                ),
            };
            if let Some(throttle) = &throttle {
                // Its committed calls are counted by their trailers
                // (`GrpcBody`), as A6 counts every call by how it ended.
                policy = policy.throttle(Arc::clone(throttle)).trailers_counted();
            }
            let mut builder = builder.policy(policy);
            builder = match budget.take() {
                Some(budget) => builder.budget(budget),
                None => builder.no_budget(),
            };
            if let Some(stats) = &self.stats {
                builder = builder.stats(stats.clone());
            }
            if let Some(limit) = self.max_elapsed {
                builder = builder.max_elapsed(limit);
            }
            builder.build()
        };
        let methods = self
            .config
            .policies()
            .iter()
            .map(|policy| build(policy.as_ref()))
            .collect::<Result<_, _>>()?;
        let unconfigured = build(None)?;
        Ok(GrpcRetryLayer {
            routes: Arc::new(Routes {
                config: self.config,
                methods,
                unconfigured,
                throttle,
            }),
            replay_limit: self.replay_limit,
            record_info: self.record_info,
        })
    }
}

impl fmt::Debug for GrpcRetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcRetryBuilder")
            .field("config", &self.config)
            .field("replay_limit", &self.replay_limit)
            .finish_non_exhaustive()
    }
}

impl<S: CloneForRetries> Layer<S> for GrpcRetryLayer {
    type Service = GrpcRetry<S>;

    fn layer(&self, inner: S) -> GrpcRetry<S> {
        GrpcRetry {
            inner: TonicBody::new(inner),
            layer: self.clone(),
        }
    }
}

/// The service of [`GrpcRetryLayer`].
#[derive(Clone)]
pub struct GrpcRetry<S> {
    inner: TonicBody<S>,
    layer: GrpcRetryLayer,
}

/// The response future of [`GrpcRetry`]: its method's [`BackoffRetry`] future,
/// whose response gets a [`RetryInfo`](tower_backoff_http::RetryInfo) and a
/// [`GrpcBody`] (which counts a committed call's trailers for the
/// config's `retryThrottling`).
pub type GrpcResponseFuture<S, B> =
    Committed<HttpResponseFuture<TonicBody<S>, Request<ReplayBody<B>>, NoTimeout, GrpcPolicy>>;

impl<S> GrpcRetry<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner.into_inner()
    }
}

impl<S: fmt::Debug> fmt::Debug for GrpcRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcRetry")
            .field("inner", self.inner.get_ref())
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, B, ResBody> Service<Request<B>> for GrpcRetry<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone,
    S::Error: AsStdError + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: 'static,
{
    type Response = Response<GrpcBody<ResBody>>;
    type Error = S::Error;
    type Future = GrpcResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Service::<Request<ReplayBody<B>>>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service readied is the one that sends the first attempt; a
        // clone takes its place for the next call.
        let fresh = self.inner.clone();
        let readied = std::mem::replace(&mut self.inner, fresh);
        let limit = self.layer.replay_limit;
        let mut request = request.map(|body| ReplayBody::with_limit(body, limit));
        request.extensions_mut().insert(TransparentRetry::default());
        // The call's deadline, read once as it starts: it bounds every
        // attempt and hedge (the engine's per-request deadline), and the
        // policy writes the time left into each of them.
        let deadline = parse_grpc_timeout(request.headers()).and_then(CallDeadline::after);
        let route = self.layer.route(request.uri().path());
        let counts = route
            .policy()
            .has_throttle()
            .then(|| route.policy().clone());
        let mut method = BackoffRetry::new(readied, route);
        // The method layers have no pacing, so the inner service's readiness
        // is all `BackoffRetry`'s own `poll_ready` would have waited for.
        let future = match deadline {
            Some(deadline) => {
                request.extensions_mut().insert(deadline);
                method.call_with_limits(request, RetryLimits::new().deadline(deadline.0))
            }
            None => method.call(request),
        };
        Committed::new(
            HttpResponseFuture::new(future, self.layer.record_info),
            counts,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_route_to_their_method_then_service_then_default() {
        let config: ServiceConfig = r#"{"methodConfig": [
            {"name": [{"service": "a.S", "method": "M"}],
             "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s",
                             "backoffMultiplier": 1, "retryableStatusCodes": [14]}},
            {"name": [{"service": "a.S"}],
             "retryPolicy": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1s",
                             "backoffMultiplier": 1, "retryableStatusCodes": [14]}},
            {"name": [{"service": "b.S"}]},
            {"name": [{}],
             "retryPolicy": {"maxAttempts": 4, "initialBackoff": "1s", "maxBackoff": "1s",
                             "backoffMultiplier": 1, "retryableStatusCodes": [14]}}
        ]}"#
        .parse()
        .unwrap();
        let layer = GrpcRetryLayer::new(&config).unwrap();
        let attempts = |path: &str| layer.route(path).max_attempts();
        assert_eq!(attempts("/a.S/M"), 2);
        assert_eq!(attempts("/a.S/Other"), 3);
        assert_eq!(attempts("/c.S/Any"), 4);
        // Configured without a retry policy: the transparent retry only.
        assert!(layer
            .route("/b.S/Any")
            .policy()
            .retryable_codes()
            .is_empty());
        assert!(layer.throttle().is_none());
    }

    #[test]
    fn a_hedged_method_gets_its_attempts_and_non_fatal_codes() {
        let config: ServiceConfig = r#"{"methodConfig": [
            {"name": [{"service": "h.S"}],
             "hedgingPolicy": {"maxAttempts": 7, "hedgingDelay": "0.1s",
                               "nonFatalStatusCodes": ["ABORTED"]}}
        ]}"#
        .parse()
        .unwrap();
        let layer = GrpcRetryLayer::builder(&config)
            .hedge_load_cap(1.0)
            .build()
            .unwrap();
        let hedged = layer.route("/h.S/M");
        assert_eq!(hedged.max_attempts(), 5, "A6's limit");
        assert_eq!(
            hedged.policy().retryable_codes(),
            crate::CodeSet::EMPTY.with(tonic::Code::Aborted)
        );
        for share in [0.0, 1.5, f64::NAN] {
            let error = GrpcRetryLayer::builder(&config)
                .hedge_load_cap(share)
                .build()
                .unwrap_err();
            assert_eq!(error.field(), "hedge_load_cap");
        }
    }
}
