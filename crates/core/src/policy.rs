//! Policies: which outcomes to retry, and how to copy a request for a retry.
//!
//! A policy is shared, stateless data (`&self`): the attempt number, the previous
//! delay and the start time belong to each request's response future. When and
//! how often to retry are the [`Schedule`](crate::Schedule)'s and the
//! [`Budget`](crate::Budget)'s business, not the policy's.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// What one attempt's outcome means.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::{Cause, Decision};
///
/// // A 429 with `Retry-After: 2`:
/// let d = Decision::retry_after(Duration::from_secs(2)).because(Cause::Throttled);
/// assert!(d.is_retry());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The attempt succeeded: return its outcome.
    Success,
    /// The outcome is final: a failure another attempt will not fix (a 400,
    /// a non-idempotent request, a server that said not to retry). Return it
    /// as is, with no retry.
    Final,
    /// The attempt failed transiently: retry if the limits and budget allow.
    Retry {
        /// A delay the server asked for (`Retry-After`), used instead of the
        /// schedule's and as is: never shortened, since a retry before the
        /// server asked is wasted. The policy decides how long a delay it
        /// accepts (the HTTP policy's `max_server_delay`) and returns
        /// [`Decision::Final`] past that. A delay that would end past the
        /// layer's time limit ends the request at once.
        after: Option<Duration>,
        /// Why it failed; budgets and adaptive pacing weigh causes differently.
        cause: Cause,
    },
}

impl Decision {
    /// Retry after the schedule's next delay.
    pub const fn retry() -> Self {
        Decision::Retry {
            after: None,
            cause: Cause::Transient,
        }
    }

    /// Retry after `delay`, as the server asked.
    pub const fn retry_after(delay: Duration) -> Self {
        Decision::Retry {
            after: Some(delay),
            cause: Cause::Transient,
        }
    }

    /// The same decision, attributed to `cause`. No effect on `Success` or `Final`.
    pub const fn because(self, cause: Cause) -> Self {
        match self {
            Decision::Retry { after, .. } => Decision::Retry { after, cause },
            other => other,
        }
    }

    /// Whether this asks for a retry.
    pub const fn is_retry(&self) -> bool {
        matches!(self, Decision::Retry { .. })
    }
}

/// Why an attempt failed, as far as the policy can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Cause {
    /// Any transient failure: a dropped connection, a 502.
    #[default]
    Transient,
    /// The attempt timed out. A token bucket charges more for it: a timeout
    /// often means the server is still working on the request.
    Timeout,
    /// The server said it is overloaded (429, 503). Adaptive pacing slows every
    /// request down when it sees this.
    Throttled,
    /// The attempt provably never reached the server (the connection was
    /// refused, an HTTP/2 stream was refused before the request was written).
    /// Once per request such a retry is *transparent*, as gRPC's retry design
    /// calls it: it goes out at once, does not count against the attempt
    /// limit and costs no budget, since the server saw nothing. A second one
    /// counts as an ordinary retry.
    NotSent,
}

/// Limits for one request that override the layer's: fewer or more attempts,
/// no retries at all, or a deadline. A policy hands them to the layer through
/// [`Policy::limits`]; the HTTP policy reads them from an `http::Request`'s
/// extensions, so a caller sets them per request with no other layer.
/// (`reqwest::Request` keeps its extensions private, so over reqwest a
/// per-request override needs a policy of your own that reads it elsewhere.)
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::RetryLimits;
///
/// let mut request = http::Request::get("http://example.test/").body(()).unwrap();
/// request
///     .extensions_mut()
///     .insert(RetryLimits::new().max_attempts(5).timeout(Duration::from_secs(2)));
/// # let _ = request;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryLimits {
    pub(crate) max_attempts: Option<u32>,
    pub(crate) deadline: Option<Instant>,
}

impl RetryLimits {
    /// No overrides: the layer's limits apply.
    pub fn new() -> Self {
        Self::default()
    }

    /// One attempt, no retries, whatever the layer says.
    pub fn no_retries() -> Self {
        Self::new().max_attempts(1)
    }

    /// Attempts for this request, the first included (zero counts as one).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts.max(1));
        self
    }

    /// The request must end by `deadline`: no retry starts whose sleep would
    /// end after it, and with
    /// [`attempt_timeout`](crate::BackoffBuilder::attempt_timeout) no attempt
    /// runs past it. The layer's `max_elapsed`, if sooner, still applies.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The request must end within `timeout` from now (see
    /// [`deadline`](Self::deadline)).
    pub fn timeout(self, timeout: Duration) -> Self {
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or(now + crate::error::MAX_DURATION);
        self.deadline(deadline)
    }
}

/// Classifies outcomes and copies requests for the [`Backoff`](crate::Backoff)
/// service.
///
/// Implement it for your own type when the ready-made ones do not fit:
/// [`RetryOnError`] (the default), [`retry_if`] and [`classify_fn`] cover most
/// needs without a new type.
///
/// ```
/// use tower_backoff::{Decision, Policy};
///
/// /// Retries only errors that say the queue is full.
/// #[derive(Clone)]
/// struct QueueFull;
///
/// impl<Req: Clone, Res> Policy<Req, Res, String> for QueueFull {
///     fn classify(&self, _: &Req, result: &Result<Res, String>) -> Decision {
///         match result {
///             Ok(_) => Decision::Success,
///             Err(e) if e.contains("queue capacity") => Decision::retry(),
///             Err(_) => Decision::Final,
///         }
///     }
///     fn clone_request(&self, req: &Req) -> Option<Req> {
///         Some(req.clone())
///     }
/// }
/// ```
pub trait Policy<Req, Res, E> {
    /// What the outcome of one attempt of `request` means.
    fn classify(&self, request: &Req, result: &Result<Res, E>) -> Decision;

    /// A copy of `request` to send again, or `None` when it must not be sent
    /// twice (a streaming body, a non-idempotent call): such a request goes out
    /// once and its outcome is returned untouched, without being classified.
    fn clone_request(&self, request: &Req) -> Option<Req>;

    /// Called with an outcome that a retry replaces, before it is dropped. The
    /// default drops it; an HTTP policy can drain a small body here so the
    /// connection goes back to its pool.
    fn discard(&self, result: Result<Res, E>) {
        drop(result);
    }

    /// Called once with the outcome returned to the caller, with the number of
    /// attempts made and the total time slept between them. The default does
    /// nothing; an HTTP policy records both in the response's extensions.
    fn finish(&self, result: &mut Result<Res, E>, attempts: u32, slept: Duration) {
        let _ = (result, attempts, slept);
    }

    /// Called once for each retry as it goes out (after its sleep and the
    /// service's readiness, once the budget paid for it), never for a retry
    /// that was stopped: the request, the number of the attempt that failed (1
    /// for the first, which is also the number of this retry), the delay slept
    /// before the retry, and the outcome it replaces. The default does nothing;
    /// wrap any policy with
    /// [`BackoffBuilder::on_retry`](crate::BackoffBuilder::on_retry) to hook a
    /// closure here.
    fn on_retry(&self, request: &Req, attempt: u32, delay: Duration, result: &Result<Res, E>) {
        let _ = (request, attempt, delay, result);
    }

    /// Called on the copy of the request that is about to go out as attempt
    /// number `attempt` (2 for the first retry), just before it is sent: the
    /// place to stamp the attempt number into a header (gRPC's
    /// `grpc-previous-rpc-attempts`). Copies for later retries are made from
    /// the unstamped request. The default does nothing.
    fn prepare_retry(&self, request: &mut Req, attempt: u32) {
        let _ = (request, attempt);
    }

    /// Limits for this one request that override the layer's, read once
    /// when it is called. The default has none; the HTTP policy reads a
    /// [`RetryLimits`] from the request's extensions.
    fn limits(&self, request: &Req) -> Option<RetryLimits> {
        let _ = request;
        None
    }

    /// Whether the layer must keep a copy of the request for every attempt:
    /// because [`classify`](Self::classify) reads it, or because an outcome
    /// may ask for the transparent retry ([`Cause::NotSent`]), which is
    /// allowed past `max_attempts`. A policy that needs neither says `false`
    /// and implements [`classify_outcome`](Self::classify_outcome): the layer
    /// then sends an attempt that cannot be retried (every attempt under
    /// `max_attempts(1)`, the last one allowed otherwise) without copying the
    /// request first, and classifies its outcome without it. The default,
    /// `true`, copies the request for every attempt.
    fn needs_request(&self) -> bool {
        true
    }

    /// What `result` means, decided without its request; called only when
    /// [`needs_request`](Self::needs_request) is `false`, and must then decide
    /// as [`classify`](Self::classify) would. Only the kind of decision is
    /// used (a success refunds the budget and counts in the stats). The
    /// default calls a response a success and an error final.
    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::Final,
        }
    }

    /// Whether the kept request itself can go out as the last attempt (see
    /// [`needs_request`](Self::needs_request)), rather than a copy. The
    /// default says yes; the HTTP policy asks the body: a
    /// `tower_backoff::http::ReplayBody` says no, since only its newest
    /// copy may be sent, and then the last attempt gets a copy like the
    /// others.
    fn can_resend(&self, request: &Req) -> bool {
        let _ = request;
        true
    }
}

impl<P, Req, Res, E> Policy<Req, Res, E> for Arc<P>
where
    P: Policy<Req, Res, E> + ?Sized,
{
    fn classify(&self, request: &Req, result: &Result<Res, E>) -> Decision {
        (**self).classify(request, result)
    }
    fn clone_request(&self, request: &Req) -> Option<Req> {
        (**self).clone_request(request)
    }
    fn discard(&self, result: Result<Res, E>) {
        (**self).discard(result)
    }
    fn finish(&self, result: &mut Result<Res, E>, attempts: u32, slept: Duration) {
        (**self).finish(result, attempts, slept)
    }
    fn on_retry(&self, request: &Req, attempt: u32, delay: Duration, result: &Result<Res, E>) {
        (**self).on_retry(request, attempt, delay, result)
    }
    fn prepare_retry(&self, request: &mut Req, attempt: u32) {
        (**self).prepare_retry(request, attempt)
    }
    fn limits(&self, request: &Req) -> Option<RetryLimits> {
        (**self).limits(request)
    }
    fn needs_request(&self) -> bool {
        (**self).needs_request()
    }
    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        (**self).classify_outcome(result)
    }
    fn can_resend(&self, request: &Req) -> bool {
        (**self).can_resend(request)
    }
}

/// Retries every error and accepts every response: the default policy.
///
/// Right for services whose errors are transport failures (a `tower::timeout`
/// `Elapsed`, a refused connection) and whose responses are answers. Requests
/// must be `Clone`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryOnError;

impl<Req: Clone, Res, E> Policy<Req, Res, E> for RetryOnError {
    fn classify(&self, _request: &Req, result: &Result<Res, E>) -> Decision {
        <Self as Policy<Req, Res, E>>::classify_outcome(self, result)
    }

    // Inline, so that it is compiled with its callers: compiled on its own,
    // it can take the request's `clone` in, build the copy in its own frame
    // and then move it whole into the caller's.
    #[inline]
    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }

    fn needs_request(&self) -> bool {
        false
    }

    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::retry(),
        }
    }
}

/// Retries when `predicate(&result)` is true; otherwise a response is a success
/// and an error is final.
///
/// Given to the builder, the closure's argument needs its type written out,
/// because the layer learns the service's response and error types only
/// later; [`Backoff::retry_if`](crate::Backoff::retry_if) on a wrapped service
/// infers it instead:
///
/// ```
/// use tower_backoff::{retry_if, BackoffLayer};
///
/// let layer = BackoffLayer::builder()
///     .policy(retry_if(|result: &Result<u16, std::io::Error>| match result {
///         Ok(status) => *status == 503,
///         Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
///     }))
///     .build()
///     .unwrap();
/// # drop(layer);
/// ```
pub fn retry_if<F>(predicate: F) -> RetryIf<F> {
    RetryIf { predicate }
}

/// A policy made by [`retry_if`].
#[derive(Clone, Copy)]
pub struct RetryIf<F> {
    predicate: F,
}

impl<F> std::fmt::Debug for RetryIf<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetryIf")
    }
}

impl<F, Req, Res, E> Policy<Req, Res, E> for RetryIf<F>
where
    F: Fn(&Result<Res, E>) -> bool,
    Req: Clone,
{
    fn classify(&self, _request: &Req, result: &Result<Res, E>) -> Decision {
        <Self as Policy<Req, Res, E>>::classify_outcome(self, result)
    }

    // Inline: as `RetryOnError`'s.
    #[inline]
    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }

    fn needs_request(&self) -> bool {
        false
    }

    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        match ((self.predicate)(result), result) {
            (true, _) => Decision::retry(),
            (false, Ok(_)) => Decision::Success,
            (false, Err(_)) => Decision::Final,
        }
    }
}

/// A policy from a closure that sees the request and the outcome and returns the
/// whole [`Decision`] (a delay the server asked for, a cause).
/// [`Backoff::classify`](crate::Backoff::classify) on a wrapped service does
/// the same with the argument types inferred.
///
/// ```
/// use std::time::Duration;
/// use tower_backoff::{classify_fn, Cause, Decision};
///
/// let policy = classify_fn(|_req: &&str, result: &Result<u16, ()>| match result {
///     Ok(429) => Decision::retry_after(Duration::from_secs(1)).because(Cause::Throttled),
///     Ok(_) => Decision::Success,
///     Err(()) => Decision::retry(),
/// });
/// # drop(policy);
/// ```
pub fn classify_fn<F>(classify: F) -> ClassifyFn<F> {
    ClassifyFn { classify }
}

/// A policy made by [`classify_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F> {
    classify: F,
}

impl<F> std::fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClassifyFn")
    }
}

impl<F, Req, Res, E> Policy<Req, Res, E> for ClassifyFn<F>
where
    F: Fn(&Req, &Result<Res, E>) -> Decision,
    Req: Clone,
{
    fn classify(&self, request: &Req, result: &Result<Res, E>) -> Decision {
        (self.classify)(request, result)
    }

    // Inline: as `RetryOnError`'s.
    #[inline]
    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

/// A policy that calls a closure for each retry, then defers everything to
/// the policy it wraps. Made by
/// [`BackoffBuilder::on_retry`](crate::BackoffBuilder::on_retry).
///
/// The closure sees the request, the number of the attempt that failed, the
/// delay before the retry and the outcome that caused it. It is a plain type
/// parameter: no box, no dynamic call, and nothing at all when unused.
#[derive(Clone, Copy)]
pub struct OnRetry<P, F> {
    policy: P,
    hook: F,
}

impl<P, F> OnRetry<P, F> {
    /// Wraps `policy`, calling `hook` for each retry.
    pub fn new(policy: P, hook: F) -> Self {
        Self { policy, hook }
    }

    /// The wrapped policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

impl<P: std::fmt::Debug, F> std::fmt::Debug for OnRetry<P, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnRetry")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<P, F, Req, Res, E> Policy<Req, Res, E> for OnRetry<P, F>
where
    P: Policy<Req, Res, E>,
    F: Fn(&Req, u32, Duration, &Result<Res, E>),
{
    fn classify(&self, request: &Req, result: &Result<Res, E>) -> Decision {
        self.policy.classify(request, result)
    }
    fn clone_request(&self, request: &Req) -> Option<Req> {
        self.policy.clone_request(request)
    }
    fn discard(&self, result: Result<Res, E>) {
        self.policy.discard(result)
    }
    fn finish(&self, result: &mut Result<Res, E>, attempts: u32, slept: Duration) {
        self.policy.finish(result, attempts, slept)
    }
    fn on_retry(&self, request: &Req, attempt: u32, delay: Duration, result: &Result<Res, E>) {
        self.policy.on_retry(request, attempt, delay, result);
        (self.hook)(request, attempt, delay, result);
    }
    fn prepare_retry(&self, request: &mut Req, attempt: u32) {
        self.policy.prepare_retry(request, attempt)
    }
    fn limits(&self, request: &Req) -> Option<RetryLimits> {
        self.policy.limits(request)
    }
    fn needs_request(&self) -> bool {
        self.policy.needs_request()
    }
    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        self.policy.classify_outcome(result)
    }
    fn can_resend(&self, request: &Req) -> bool {
        self.policy.can_resend(request)
    }
}
