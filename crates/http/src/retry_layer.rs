//! [`HttpRetryLayer`]: the HTTP front-end of the retry engine, one layer for
//! the whole job. Around a [`BackoffRetry`] with the [`HttpPolicy`], it
//! - records a reqwest request's streaming body so it can be sent again (up
//!   to the replay limit; past it the request goes out once);
//! - when asked (or when its policy classifies bodies), reads a response
//!   body of known length within the buffer limit whole before judging it,
//!   so a body cut short is a retryable error; by default bodies stream
//!   through untouched, and one cut short fails the caller's read;
//! - reads a caller's per-request [`RetryLimits`] from the request's
//!   extensions, and tells the caller what the retries cost in a
//!   [`RetryInfo`] in the response's extensions;
//! - keeps a circuit breaker per host, so that one client of several hosts
//!   never has a healthy host's requests rejected for another's outage.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use ::http::{Extensions, Request, Response};
use pin_project_lite::pin_project;
use tower_backoff_core::breaker::CircuitBreaker;
use tower_backoff_core::budget::Budget;
use tower_backoff_core::deadline::{AttemptTimer, Guarded};
use tower_backoff_core::events::{Observer, Outcome, RetryArgs};
use tower_backoff_core::future::ResponseFuture;
use tower_backoff_core::policy::{Policy, RetryLimits};
use tower_backoff_core::CloneForRetries;
use tower_backoff_core::{
    AdaptivePacing, BackoffBuilder, BackoffLayer, BackoffRetry, ConfigError, Error, Hedging,
    Jitter, Schedule, Stats,
};
use tower_layer::Layer;
type BoxError = Box<dyn std::error::Error + Send + Sync>;
use tower_service::Service;

use super::buffer::BufferBody;
use super::info::RetryInfo;
use super::per_host::{HostLayers, MakeHostLayer, RequestAuthority, DEFAULT_MAX_HOSTS};
use super::policy::HttpPolicy;
use super::replay::DEFAULT_REPLAY_LIMIT;

/// Most bytes of a response body [`HttpRetryLayer`] reads whole before
/// judging it when its policy classifies bodies
/// ([`HttpPolicy::retry_on_body`]) and no
/// [buffer limit](HttpRetryBuilder::buffer_limit) was set: 1 MiB, and only
/// for a body whose `content-length` says it fits. Without a body
/// classifier, the layer reads nothing ahead unless a limit is set.
#[doc(hidden)]
pub const DEFAULT_RESPONSE_BUFFER_LIMIT: usize = 1024 * 1024;

/// Retries HTTP requests with the [`HttpPolicy`] and the default budget, in
/// one layer around `reqwest::Client` (feature `reqwest`), hyper-util's
/// `Client` or any `Service<http::Request<B>>`.
///
/// What it does, beside the retries themselves:
/// - **Request bodies.** A `reqwest::Request`'s body is recorded as it is
///   sent, up to the [replay limit](HttpRetryBuilder::replay_limit) (64 KiB
///   by default; a body in memory whatever its size), and sent again byte
///   for byte; a body that outgrows the limit goes out once and the caller
///   gets the server's real answer. A body in memory goes out as its bytes,
///   so reqwest follows a 307 or 308 redirect with it, as without the
///   layer. Over hyper-util, a request body is copied when its type is
///   `Clone` (`Full<Bytes>`, `String`) or a [`ReplayBody`](super::ReplayBody).
/// - **Response bodies.** By default the response is returned as soon as
///   its headers arrive and its body streams through untouched: a body cut
///   short fails the caller's read of it (hyper and reqwest check the
///   `content-length`), so it is never taken for a whole one, but it is not
///   retried. With a [buffer limit](HttpRetryBuilder::buffer_limit) (or a
///   policy with [`HttpPolicy::retry_on_body`], which reads up to
///   [`DEFAULT_RESPONSE_BUFFER_LIMIT`] unless told otherwise), a response
///   whose `content-length` is within the limit is read whole before it is
///   judged: a body cut short or failing mid-read is a retryable error (the
///   real error is returned when retries run out), and the body classifier
///   can read it. That costs the caller its first byte until the last one
///   has arrived, the body's bytes held per request in flight, and over
///   reqwest a copy of the response's head (`docs/RESULTS.md` measures
///   both sides per size); a body without a length (chunked, an
///   event stream) or a longer one always streams through. The response
///   body becomes a [`BufferedBody`](super::BufferedBody) over hyper-util
///   (reqwest keeps its own types), and the error a `tower::BoxError`.
/// - **Per request**, a [`RetryLimits`] in an `http::Request`'s extensions
///   overrides the layer's limits; every response returned carries a
///   [`RetryInfo`].
/// - **Per host**, with a [circuit breaker](HttpRetryBuilder::circuit_breaker):
///   each authority (scheme, host and port) the client calls gets a breaker
///   of its own, so a dead host's breaker never rejects a request to a
///   healthy one; with it, its own [fresh](Self::fresh) budget and pacing.
///   [`circuit_breaker_for_all_hosts`](HttpRetryBuilder::circuit_breaker_for_all_hosts)
///   keeps one of each for every host instead.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// # #[cfg(feature = "reqwest")]
/// # fn main() -> Result<(), tower_backoff::ConfigError> {
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_backoff::http::{HttpRetry, HttpRetryLayer};
///
/// // The type to name in a struct field: the client, retried.
/// let client: HttpRetry<reqwest::Client> = ServiceBuilder::new()
///     .layer(HttpRetryLayer::builder().max_attempts(4).build()?)
///     .service(reqwest::Client::new());
/// # drop(client);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "reqwest"))]
/// # fn main() {}
/// ```
pub struct HttpRetryLayer {
    // Read by the middleware made from this layer, too.
    pub(crate) layer: BackoffLayer<HttpPolicy, Guarded>,
    /// Each host's layer, when the breaker is kept per host.
    pub(crate) hosts: Option<Arc<HostLayers<BackoffLayer<HttpPolicy, Guarded>>>>,
    pub(crate) record_info: bool,
    pub(crate) replay_limit: usize,
    /// `None` until set: read ahead only for a policy that classifies
    /// bodies (see [`read_ahead_limit`](Self::read_ahead_limit)).
    pub(crate) buffer_limit: Option<usize>,
}

const DEFAULTS: &str = "the default settings are valid";

impl HttpRetryLayer {
    /// The defaults: the [`HttpPolicy`]'s, the layer's (3 attempts,
    /// exponential backoff with full jitter, the default budget), and the
    /// default replay and buffer limits.
    pub fn new() -> Self {
        Self::builder().build().expect(DEFAULTS)
    }

    /// A builder, starting from [`new`](Self::new)'s defaults.
    pub fn builder() -> HttpRetryBuilder {
        HttpRetryBuilder {
            backoff: BackoffLayer::builder().policy(HttpPolicy::new()).guarded(),
            breaker_for_all_hosts: false,
            record_info: true,
            replay_limit: DEFAULT_REPLAY_LIMIT,
            buffer_limit: None,
        }
    }
}

impl Default for HttpRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpRetryLayer {
    /// `layer` with the default replay and buffer limits; its breaker, if it
    /// has one, kept per host unless `for_all_hosts`.
    fn assemble(layer: BackoffLayer<HttpPolicy, Guarded>, for_all_hosts: bool) -> Self {
        let per_host = layer.breaker().is_some() && !for_all_hosts;
        Self {
            hosts: per_host.then(|| Arc::new(HostLayers::new(layer.clone(), DEFAULT_MAX_HOSTS))),
            layer,
            record_info: true,
            replay_limit: DEFAULT_REPLAY_LIMIT,
            buffer_limit: None,
        }
    }

    /// How far response bodies are read ahead: the
    /// [buffer limit](HttpRetryBuilder::buffer_limit) if one was set, else
    /// [`DEFAULT_RESPONSE_BUFFER_LIMIT`] for a policy that classifies bodies
    /// ([`HttpPolicy::retry_on_body`]), which needs them whole, and 0 (none)
    /// for any other.
    pub(crate) fn read_ahead_limit(&self) -> usize {
        self.buffer_limit
            .unwrap_or(if self.layer.policy().classifies_bodies() {
                DEFAULT_RESPONSE_BUFFER_LIMIT
            } else {
                0
            })
    }

    /// Whether each host gets a circuit breaker of its own: a layer with a
    /// breaker, unless it was built with
    /// [`circuit_breaker_for_all_hosts`](HttpRetryBuilder::circuit_breaker_for_all_hosts).
    pub fn breaker_per_host(&self) -> bool {
        self.hosts.is_some() && self.layer.breaker().is_some()
    }

    /// Whether each host gets the layer's state of its own (budget, breaker,
    /// pacing, hedging latencies): [`per_host`](Self::per_host), or a
    /// breaker kept per host.
    pub fn is_per_host(&self) -> bool {
        self.hosts.is_some()
    }

    /// Stops adding [`RetryInfo`] to responses. `http::Extensions` boxes
    /// every value, so recording it costs one small allocation per request.
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// Records up to `bytes` of a streaming request body (see
    /// [`HttpRetryBuilder::replay_limit`]).
    pub fn replay_limit(mut self, bytes: usize) -> Self {
        self.replay_limit = bytes;
        self
    }

    /// Reads whole a response body of known length up to `bytes` (see
    /// [`HttpRetryBuilder::buffer_limit`]); 0 reads nothing ahead.
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = Some(bytes);
        self
    }

    /// The retry layer it wraps. With the breaker kept per host, that of
    /// the first host called; every other host has a
    /// [fresh](BackoffLayer::fresh) copy.
    pub fn backoff(&self) -> &BackoffLayer<HttpPolicy, Guarded> {
        &self.layer
    }

    /// The same layer with a budget, circuit breaker and pacing of its own
    /// (see [`BackoffLayer::fresh`]), and no host called yet.
    pub fn fresh(&self) -> Self {
        let layer = self.layer.fresh();
        Self {
            hosts: self
                .hosts
                .as_ref()
                .map(|hosts| Arc::new(HostLayers::new(layer.clone(), hosts.max_hosts()))),
            layer,
            ..self.clone()
        }
    }

    /// This layer per host: each authority (scheme, host and port) gets a
    /// [fresh](Self::fresh) copy on its first request, so one host's outage
    /// spends only its own retries and opens only its own breaker, while
    /// stats and observers add every host up. At most
    /// [`DEFAULT_MAX_HOSTS`](crate::DEFAULT_MAX_HOSTS) hosts are kept; the
    /// one idle longest makes room for a new one. The service's type stays
    /// [`HttpRetry<S>`]; it is always ready, and each request waits for the
    /// client's readiness in its own future.
    pub fn per_host(mut self) -> Self {
        if self.hosts.is_none() {
            let hosts = HostLayers::new(self.layer.clone(), DEFAULT_MAX_HOSTS);
            self.hosts = Some(Arc::new(hosts));
        }
        self
    }

    /// Keeps at most `hosts` hosts' layers, as
    /// [`PerHostLayer::max_hosts`](crate::PerHostLayer::max_hosts) does
    /// (default [`DEFAULT_MAX_HOSTS`](crate::DEFAULT_MAX_HOSTS)); the one
    /// idle longest makes room for a new one. Makes the layer
    /// [per host](Self::per_host) if it was not, and forgets the hosts
    /// called so far.
    pub fn max_hosts(mut self, hosts: usize) -> Self {
        self.hosts = Some(Arc::new(HostLayers::new(self.layer.clone(), hosts)));
        self
    }
}

impl MakeHostLayer for HttpRetryLayer {
    type Layer = Self;

    /// A fresh copy for one host: it keeps no table of hosts of its own.
    fn make_host_layer(&self) -> Self {
        Self {
            hosts: None,
            ..self.fresh()
        }
    }

    /// A fresh copy for the host `authority`, whose events and metrics name
    /// it (see [`BackoffLayer::for_host`]).
    fn make_layer_for_host(&self, authority: &str) -> Self {
        Self {
            hosts: None,
            layer: self.layer.for_host(authority),
            ..self.clone()
        }
    }
}

/// The layer's retries with the default replay and buffer limits; its
/// circuit breaker, if it has one, kept per host as
/// [`HttpRetryBuilder::circuit_breaker`] keeps it.
impl From<BackoffLayer<HttpPolicy>> for HttpRetryLayer {
    fn from(layer: BackoffLayer<HttpPolicy>) -> Self {
        Self::assemble(layer.guarded(), false)
    }
}

/// The layer's retries with the default replay and buffer limits; its
/// circuit breaker, if it has one, kept per host as
/// [`HttpRetryBuilder::circuit_breaker`] keeps it.
impl From<BackoffLayer<HttpPolicy, Guarded>> for HttpRetryLayer {
    fn from(layer: BackoffLayer<HttpPolicy, Guarded>) -> Self {
        Self::assemble(layer, false)
    }
}

impl Clone for HttpRetryLayer {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            hosts: self.hosts.clone(),
            record_info: self.record_info,
            replay_limit: self.replay_limit,
            buffer_limit: self.buffer_limit,
        }
    }
}

impl fmt::Debug for HttpRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRetryLayer")
            .field("layer", &self.layer)
            .field("breaker_per_host", &self.breaker_per_host())
            .field("record_info", &self.record_info)
            .field("replay_limit", &self.replay_limit)
            .field("buffer_limit", &self.read_ahead_limit())
            .finish()
    }
}

impl<S: CloneForRetries> Layer<S> for HttpRetryLayer {
    type Service = HttpRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let buffered = BufferBody::with_limit(inner, self.read_ahead_limit()).known_length_only();
        HttpRetry {
            inner: self.layer.layer(buffered),
            hosts: self.hosts.clone(),
            record_info: self.record_info,
            replay_limit: self.replay_limit,
        }
    }
}

/// Builds an [`HttpRetryLayer`]: the HTTP settings, and the retry layer's
/// own (each as on [`BackoffBuilder`]).
#[must_use]
pub struct HttpRetryBuilder {
    backoff: BackoffBuilder<HttpPolicy, Guarded>,
    breaker_for_all_hosts: bool,
    record_info: bool,
    replay_limit: usize,
    buffer_limit: Option<usize>,
}

impl HttpRetryBuilder {
    /// Classifies with `policy` instead of `HttpPolicy::new()`.
    pub fn policy(self, policy: HttpPolicy) -> Self {
        self.map(|backoff| backoff.policy(policy))
    }

    /// Records up to `bytes` of a streaming request body (default
    /// [`DEFAULT_REPLAY_LIMIT`], 64 KiB) to send it again; a longer body goes
    /// out once.
    pub fn replay_limit(mut self, bytes: usize) -> Self {
        self.replay_limit = bytes;
        self
    }

    /// Reads whole, before judging it, a response body whose
    /// `content-length` is at most `bytes`, so that a body cut short is
    /// retried; others stream through. 0 reads nothing ahead. Unset, the
    /// layer reads nothing ahead, unless its policy classifies bodies
    /// ([`HttpPolicy::retry_on_body`]): then up to
    /// [`DEFAULT_RESPONSE_BUFFER_LIMIT`] (1 MiB).
    ///
    /// Reading ahead holds the caller's first byte until the last one has
    /// arrived, and the body in memory per request in flight; what it buys
    /// is a retry of a body cut short, which otherwise fails the caller's
    /// read (`docs/RESULTS.md`, issue 54, has both measured per size).
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = Some(bytes);
        self
    }

    /// Adds no [`RetryInfo`] to responses.
    pub fn without_retry_info(mut self) -> Self {
        self.record_info = false;
        self
    }

    /// See [`BackoffBuilder::schedule`].
    pub fn schedule(self, schedule: impl Schedule + Send + Sync + 'static) -> Self {
        self.map(|backoff| backoff.schedule(schedule))
    }

    /// See [`BackoffBuilder::jitter`].
    pub fn jitter(self, jitter: Jitter) -> Self {
        self.map(|backoff| backoff.jitter(jitter))
    }

    /// See [`BackoffBuilder::max_attempts`].
    pub fn max_attempts(self, attempts: u32) -> Self {
        self.map(|backoff| backoff.max_attempts(attempts))
    }

    /// See [`BackoffBuilder::unlimited_attempts`].
    pub fn unlimited_attempts(self) -> Self {
        self.map(BackoffBuilder::unlimited_attempts)
    }

    /// See [`BackoffBuilder::stop_at_cap`].
    pub fn stop_at_cap(self) -> Self {
        self.map(BackoffBuilder::stop_at_cap)
    }

    /// See [`BackoffBuilder::max_elapsed`].
    pub fn max_elapsed(self, limit: Duration) -> Self {
        self.map(|backoff| backoff.max_elapsed(limit))
    }

    /// See [`BackoffBuilder::seed`].
    pub fn seed(self, seed: u64) -> Self {
        self.map(|backoff| backoff.seed(seed))
    }

    /// See [`BackoffBuilder::budget`].
    pub fn budget(self, budget: impl Budget + 'static) -> Self {
        self.map(|backoff| backoff.budget(budget))
    }

    /// See [`BackoffBuilder::no_budget`].
    pub fn no_budget(self) -> Self {
        self.map(BackoffBuilder::no_budget)
    }

    /// See [`BackoffBuilder::hedge`]: a copy of a request still pending
    /// after a delay, for idempotent requests (and those with an
    /// `Idempotency-Key`) only; the losing copies are cancelled, which
    /// resets their HTTP/2 stream or closes their HTTP/1 connection.
    pub fn hedge(self, hedging: Hedging) -> Self {
        self.map(|backoff| backoff.hedge(hedging))
    }

    /// See [`BackoffBuilder::pacing`].
    pub fn pacing(self, pacing: AdaptivePacing) -> Self {
        self.map(|backoff| backoff.pacing(pacing))
    }

    /// See [`BackoffBuilder::stats`].
    pub fn stats(self, stats: Stats) -> Self {
        self.map(|backoff| backoff.stats(stats))
    }

    /// See [`BackoffBuilder::observer`].
    pub fn observer(self, observer: impl Observer + 'static) -> Self {
        self.map(|backoff| backoff.observer(observer))
    }

    /// See [`BackoffBuilder::on_retry`]: `hook(&retry, outcome)` as each
    /// retry goes out, no annotation needed. The outcome's error is
    /// [`Error`]`<E>` of the client's error `E` (over hyper-util, `E` is a
    /// `BoxError`); its response is the client's (over hyper-util, an
    /// `http::Response<BufferedBody<B>>`).
    pub fn on_retry<F>(self, hook: F) -> Self
    where
        F: Fn(&RetryArgs, Outcome<'_>) + Send + Sync + 'static,
    {
        self.map(|backoff| backoff.on_retry(hook))
    }

    /// See [`BackoffBuilder::attempt_timeout`].
    pub fn attempt_timeout(self, limit: Duration) -> Self {
        self.map(|backoff| backoff.attempt_timeout(limit))
    }

    /// Stops calling a host that keeps failing (see
    /// [`BackoffBuilder::circuit_breaker`]), with a breaker per host: each
    /// authority (scheme, host and port) the client calls gets its own, so a
    /// request to a healthy host is never rejected because another host is
    /// down. The first host called gets `breaker` itself (keep a clone to
    /// read its [`state`](CircuitBreaker::state)); every other host a
    /// [fresh](CircuitBreaker::fresh) one with its settings, made on its
    /// first request.
    ///
    /// Each host gets, with its breaker, a [fresh](BackoffLayer::fresh) copy
    /// of the rest of the layer's per-host state: its token-bucket budget
    /// (the default one included), its pacing and its hedging's latency
    /// estimate, so a dead host spends only its own retries. Stats and observers add every host up; a budget
    /// passed as an `Arc` stays shared. At most [`DEFAULT_MAX_HOSTS`]
    /// hosts are kept; the one idle longest makes room for a new one.
    ///
    /// With a breaker the service is always ready: each request waits for
    /// the client's readiness in its own future, as a
    /// [per-host](HttpRetryLayer::per_host) layer's do.
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// # #[cfg(feature = "reqwest")]
    /// # fn main() -> Result<(), tower_backoff::ConfigError> {
    /// use tower::ServiceBuilder;
    /// use tower_backoff::breaker::CircuitBreaker;
    /// use tower_backoff::http::{HttpRetry, HttpRetryLayer};
    ///
    /// // One client for every host it calls, one breaker per host.
    /// let client: HttpRetry<reqwest::Client> = ServiceBuilder::new()
    ///     .layer(HttpRetryLayer::builder().circuit_breaker(CircuitBreaker::new()).build()?)
    ///     .service(reqwest::Client::new());
    /// # drop(client);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "reqwest"))]
    /// # fn main() {}
    /// ```
    ///
    /// [`DEFAULT_MAX_HOSTS`]: crate::DEFAULT_MAX_HOSTS
    pub fn circuit_breaker(self, breaker: CircuitBreaker) -> Self {
        let mut builder = self.map(|backoff| backoff.circuit_breaker(breaker));
        builder.breaker_for_all_hosts = false;
        builder
    }

    /// One circuit breaker for every host the client calls, where
    /// [`circuit_breaker`](Self::circuit_breaker) keeps one per host: any
    /// host's failures count towards opening it, and once open it rejects
    /// requests to every host. The layer keeps one budget and pacing for
    /// every host, as a layer without a breaker does, and its service passes
    /// the client's readiness through. For a client of one host (it saves
    /// looking the host up on each request), or for a breaker that guards
    /// what every host is reached through (one proxy, one tunnel).
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use tower_backoff::breaker::CircuitBreaker;
    /// use tower_backoff::http::HttpRetryLayer;
    ///
    /// let breaker = CircuitBreaker::new();
    /// let layer = HttpRetryLayer::builder()
    ///     .circuit_breaker_for_all_hosts(breaker.clone())
    ///     .build()?;
    /// assert!(!layer.breaker_per_host());
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    pub fn circuit_breaker_for_all_hosts(self, breaker: CircuitBreaker) -> Self {
        let mut builder = self.map(|backoff| backoff.circuit_breaker(breaker));
        builder.breaker_for_all_hosts = true;
        builder
    }

    /// Checks every setting and builds the layer per host: each authority
    /// gets a budget, circuit breaker and pacing of its own (see
    /// [`HttpRetryLayer::per_host`]).
    ///
    /// ```
    /// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
    /// use tower_backoff::http::HttpRetryLayer;
    ///
    /// let per_host = HttpRetryLayer::builder().max_attempts(4).build_per_host()?;
    /// # drop(per_host);
    /// # Ok::<_, tower_backoff::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub fn build_per_host(self) -> Result<HttpRetryLayer, ConfigError> {
        self.build().map(HttpRetryLayer::per_host)
    }

    /// Checks every setting and builds the layer.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first retry setting that cannot work
    /// (see [`BackoffBuilder::build`]).
    pub fn build(self) -> Result<HttpRetryLayer, ConfigError> {
        Ok(HttpRetryLayer {
            record_info: self.record_info,
            replay_limit: self.replay_limit,
            buffer_limit: self.buffer_limit,
            ..HttpRetryLayer::assemble(self.backoff.build()?, self.breaker_for_all_hosts)
        })
    }

    /// The same HTTP settings around what `change` makes of the layer's
    /// builder.
    fn map(
        self,
        change: impl FnOnce(BackoffBuilder<HttpPolicy, Guarded>) -> BackoffBuilder<HttpPolicy, Guarded>,
    ) -> HttpRetryBuilder {
        HttpRetryBuilder {
            backoff: change(self.backoff),
            breaker_for_all_hosts: self.breaker_for_all_hosts,
            record_info: self.record_info,
            replay_limit: self.replay_limit,
            buffer_limit: self.buffer_limit,
        }
    }
}

impl fmt::Debug for HttpRetryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRetryBuilder")
            .field("backoff", &self.backoff)
            .field("breaker_for_all_hosts", &self.breaker_for_all_hosts)
            .field("record_info", &self.record_info)
            .field("replay_limit", &self.replay_limit)
            .field("buffer_limit", &self.buffer_limit)
            .finish()
    }
}

/// The service of an [`HttpRetryLayer`]: `S`, retried. Its inner stack (a
/// [`BackoffRetry`] over a [`BufferBody`](crate::parts::BufferBody)) is an implementation detail;
/// name this type instead.
///
/// With its circuit breaker kept per host (the
/// [default](HttpRetryBuilder::circuit_breaker) for a layer with one), each
/// request goes through its host's retry layer, and the service is always
/// ready: the request waits for the client's readiness in its future.
pub struct HttpRetry<S> {
    inner: BackoffRetry<BufferBody<S>, HttpPolicy, Guarded>,
    hosts: Option<Arc<HostLayers<BackoffLayer<HttpPolicy, Guarded>>>>,
    record_info: bool,
    replay_limit: usize,
}

impl<S> HttpRetry<S> {
    /// The client it retries.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref().get_ref()
    }

    /// How many hosts have a layer of their own so far: 0 for a layer that
    /// is not [per host](HttpRetryLayer::per_host).
    pub fn hosts(&self) -> usize {
        self.hosts.as_ref().map_or(0, |hosts| hosts.len())
    }

    /// Unwraps the client it retries.
    pub fn into_inner(self) -> S {
        self.inner.into_inner().into_inner()
    }

    /// The retry service of the request's host: one made around a clone of
    /// the client, from the host's own layer.
    fn for_host(
        &self,
        hosts: &HostLayers<BackoffLayer<HttpPolicy, Guarded>>,
        request: &impl RequestAuthority,
    ) -> BackoffRetry<BufferBody<S>, HttpPolicy, Guarded>
    where
        S: Clone,
    {
        let layer = hosts.get(
            request.authority(),
            BackoffLayer::with_host,
            BackoffLayer::for_host,
        );
        layer.layer(self.inner.get_ref().clone())
    }
}

impl<S: Clone> Clone for HttpRetry<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            hosts: self.hosts.clone(),
            record_info: self.record_info,
            replay_limit: self.replay_limit,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for HttpRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpRetry")
            .field("inner", &self.inner)
            .field("hosts", &self.hosts.as_ref().map(|hosts| hosts.len()))
            .field("record_info", &self.record_info)
            .field("replay_limit", &self.replay_limit)
            .finish()
    }
}

/// hyper-util's client, or any `Service<http::Request<B>>`.
impl<S, B> Service<Request<B>> for HttpRetry<S>
where
    S: Clone,
    BufferBody<S>: Service<Request<B>, Error = BoxError>,
    <BufferBody<S> as Service<Request<B>>>::Response: ResponseExtensions + 'static,
    HttpPolicy:
        Policy<Request<B>, <BufferBody<S> as Service<Request<B>>>::Response, Error<BoxError>>,
{
    type Response = <BufferBody<S> as Service<Request<B>>>::Response;
    // Boxed, as tower's own middleware box theirs: `BufferBody`'s error is
    // a `BoxError`, for which `Error<BoxError>` cannot implement
    // `std::error::Error`, and so could not be `?`-converted.
    type Error = BoxError;
    type Future = HttpResponseFuture<BufferBody<S>, Request<B>, Guarded, HttpPolicy, BoxError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.hosts.is_some() {
            return Poll::Ready(Ok(()));
        }
        Service::<Request<B>>::poll_ready(&mut self.inner, cx).map_err(Error::into_box_error)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limits = request.extensions().get::<RetryLimits>().copied();
        if let Some(hosts) = &self.hosts {
            let host = self.for_host(hosts, &request);
            return HttpResponseFuture::readying(host, request, limits, self.record_info);
        }
        let inner = match limits {
            Some(limits) => self.inner.call_with_limits(request, limits),
            None => self.inner.call(request),
        };
        HttpResponseFuture::new(inner, self.record_info)
    }
}

/// `reqwest::Client`: each request's body is recorded for replay.
#[cfg(feature = "reqwest")]
impl<S> Service<reqwest::Request> for HttpRetry<S>
where
    S: Service<reqwest::Request, Response = reqwest::Response> + Clone,
    S::Error: From<reqwest::Error> + 'static,
    HttpPolicy: Policy<super::recorded::RecordedRequest, reqwest::Response, Error<S::Error>>,
{
    type Response = reqwest::Response;
    type Error = Error<S::Error>;
    type Future = HttpResponseFuture<BufferBody<S>, super::recorded::RecordedRequest>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.hosts.is_some() {
            return Poll::Ready(Ok(()));
        }
        Service::<super::recorded::RecordedRequest>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: reqwest::Request) -> Self::Future {
        let host = self
            .hosts
            .as_ref()
            .map(|hosts| self.for_host(hosts, &request));
        let recorded = super::recorded::RecordedRequest::record(request, self.replay_limit);
        match host {
            Some(host) => HttpResponseFuture::readying(host, recorded, None, self.record_info),
            None => HttpResponseFuture::new(self.inner.call(recorded), self.record_info),
        }
    }
}

pin_project! {
    /// The response future of an [`HttpRetry`] (and of the gRPC layer): the
    /// retry engine's future, whose response gets a [`RetryInfo`].
    ///
    /// It resolves to the layer's error as `O` (see `OutcomeError`): as it
    /// is, or boxed over hyper-util.
    pub struct HttpResponseFuture<S, Req, T = Guarded, P = HttpPolicy, O = <T as AttemptTimer<<S as Service<Req>>::Error>>::Error>
    where
        S: Service<Req>,
        T: AttemptTimer<S::Error>,
    {
        #[pin]
        state: State<ResponseFuture<S, P, Req, T>, BackoffRetry<S, P, T>, Req, T::Error>,
        record_info: bool,
        error: PhantomData<fn() -> O>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, R, Req, E> {
        // A host's retry service, waiting for the client to be ready.
        Readying { service: R, request: Option<Req>, limits: Option<RetryLimits> },
        Called { #[pin] inner: F },
        // The request could not be sent at all: its error, once.
        Failed { error: Option<E> },
    }
}

impl<S, Req, T, P, O> HttpResponseFuture<S, Req, T, P, O>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    /// Records a [`RetryInfo`] on the response of `inner` if `record_info`.
    pub fn new(inner: ResponseFuture<S, P, Req, T>, record_info: bool) -> Self {
        Self {
            state: State::Called { inner },
            record_info,
            error: PhantomData,
        }
    }

    /// A request that failed before its first attempt: `error`.
    pub fn failed(error: T::Error) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            record_info: false,
            error: PhantomData,
        }
    }

    /// `request`, sent through `service` (with `limits`, if any) once it is
    /// ready.
    fn readying(
        service: BackoffRetry<S, P, T>,
        request: Req,
        limits: Option<RetryLimits>,
        record_info: bool,
    ) -> Self {
        Self {
            state: State::Readying {
                service,
                request: Some(request),
                limits,
            },
            record_info,
            error: PhantomData,
        }
    }
}

impl<S, Req, T, P, O> Future for HttpResponseFuture<S, Req, T, P, O>
where
    S: Service<Req> + Clone,
    S::Response: ResponseExtensions,
    T: AttemptTimer<S::Error>,
    T::Error: OutcomeError<O>,
    P: Policy<Req, S::Response, T::Error>,
    S::Response: 'static,
    T::Error: 'static,
{
    type Output = Result<S::Response, O>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut state = this.state;
        let mut inner = loop {
            match state.as_mut().project() {
                StateProj::Readying {
                    service,
                    request,
                    limits,
                } => {
                    if let Err(error) = ready!(Service::<Req>::poll_ready(service, cx)) {
                        state.set(State::Failed { error: None });
                        return Poll::Ready(Err(error.into_outcome_error()));
                    }
                    let request = request.take().expect("sent once");
                    let inner = match *limits {
                        Some(limits) => service.call_with_limits(request, limits),
                        None => service.call(request),
                    };
                    state.set(State::Called { inner });
                }
                StateProj::Called { inner } => break inner,
                StateProj::Failed { error } => {
                    // Polled again after it returned: pending, as a fused future.
                    return error
                        .take()
                        .map_or(Poll::Pending, |e| Poll::Ready(Err(e.into_outcome_error())));
                }
            }
        };
        let mut outcome = ready!(inner.as_mut().poll(cx));
        if let (Ok(response), true) = (&mut outcome, *this.record_info) {
            let info = RetryInfo::new(inner.attempts(), inner.slept());
            response.extensions_mut().insert(info);
        }
        Poll::Ready(outcome.map_err(OutcomeError::into_outcome_error))
    }
}

impl<S, Req, T, P, O> fmt::Debug for HttpResponseFuture<S, Req, T, P, O>
where
    S: Service<Req>,
    T: AttemptTimer<S::Error>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("HttpResponseFuture");
        match &self.state {
            State::Readying { .. } => debug.field("readying", &true),
            State::Called { inner } => debug.field("inner", inner),
            State::Failed { .. } => debug.field("failed", &true),
        };
        debug.finish_non_exhaustive()
    }
}

/// The error an [`HttpResponseFuture`] resolves to for the layer's error:
/// the same (reqwest, gRPC), or boxed (`Error<BoxError>` over hyper-util).
#[doc(hidden)]
pub trait OutcomeError<O> {
    /// The error as the future returns it.
    fn into_outcome_error(self) -> O;
}

impl<E> OutcomeError<E> for E {
    fn into_outcome_error(self) -> E {
        self
    }
}

impl OutcomeError<BoxError> for Error<BoxError> {
    fn into_outcome_error(self) -> BoxError {
        self.into_box_error()
    }
}

/// A response with extensions, where the HTTP front-ends put the
/// [`RetryInfo`]: `http::Response` and `reqwest::Response`.
pub trait ResponseExtensions {
    /// The response's extensions.
    fn extensions_mut(&mut self) -> &mut Extensions;
}

impl<B> ResponseExtensions for Response<B> {
    fn extensions_mut(&mut self) -> &mut Extensions {
        Response::extensions_mut(self)
    }
}

#[cfg(feature = "reqwest")]
impl ResponseExtensions for reqwest::Response {
    fn extensions_mut(&mut self) -> &mut Extensions {
        reqwest::Response::extensions_mut(self)
    }
}
