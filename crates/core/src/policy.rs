//! Policies: which outcomes to retry, and how to copy a request for a retry.
//!
//! A policy is shared, stateless data (`&self`): the attempt number, the previous
//! delay and the start time belong to each request's response future. When and
//! how often to retry are the [`Schedule`](crate::Schedule)'s and the
//! [`Budget`](crate::Budget)'s business, not the policy's.

use std::sync::Arc;
use std::time::Duration;

use crate::events::RetryArgs;

pub use crate::decision::{Cause, Decision};

use tokio::time::Instant;

/// Limits for one request that override the layer's: fewer or more attempts,
/// no retries at all, or a deadline. A front-end hands them to the engine
/// with [`BackoffRetry::call_with_limits`](crate::BackoffRetry::call_with_limits); the
/// HTTP layer (`tower_backoff::http::HttpRetryLayer`) reads them from an
/// `http::Request`'s extensions, so a caller sets them per request with no
/// other layer. The policy has no say: it classifies outcomes.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
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
    ///
    /// Fewer than the layer's always hold. More are bounded by the layer's
    /// budget, which every retry pays: the default one holds one request's
    /// retries for the layer's own `max_attempts`, so on a fresh or quiet
    /// layer a request allowed 5 of a 3-attempt layer makes 3; a busy layer
    /// holds more (a tenth of its recent successes). Give the layer the most
    /// attempts any of its requests takes, and fewer to the others here.
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

/// Classifies outcomes and copies requests for the [`BackoffRetry`](crate::BackoffRetry)
/// service: two required methods ([`classify`](Self::classify),
/// [`clone_request`](Self::clone_request)) and four provided ones, each with
/// a default that fits most policies ([`needs_request`](Self::needs_request),
/// [`classify_outcome`](Self::classify_outcome),
/// [`prepare_retry`](Self::prepare_retry), [`prepare_hedge`](Self::prepare_hedge)).
///
/// Implement it for your own type when the ready-made ones do not fit:
/// [`RetryOnError`] (the default), [`retry_if`] and [`classify_fn`] cover most
/// needs without a new type. What happens around a retry (counting, logging,
/// tracing) is for an [`Observer`](crate::events::Observer), which changes no
/// type: see [`BackoffBuilder::on_retry`](crate::BackoffBuilder::on_retry).
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
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
    ///
    /// Every attempt goes out as a copy, the last one too, so that the
    /// request is at hand to classify its outcome and for the one
    /// transparent retry ([`Cause::NotSent`]) that may follow it; unless
    /// [`needs_request`](Self::needs_request) says otherwise.
    fn clone_request(&self, request: &Req) -> Option<Req>;

    /// Whether the layer must keep the request to classify every outcome:
    /// because [`classify`](Self::classify) reads it, or because an outcome
    /// may ask for the transparent retry ([`Cause::NotSent`]), which may
    /// follow the last attempt. A policy that needs neither says `false` and
    /// implements [`classify_outcome`](Self::classify_outcome): a layer
    /// without hedging then sends the last attempt allowed without copying
    /// the request first (one `clone_request` fewer per retried request).
    /// The default, `true`, copies the request for every attempt.
    fn needs_request(&self) -> bool {
        true
    }

    /// What `result` means, decided without its request: called only for
    /// the outcome of an attempt sent without a copy, when
    /// [`needs_request`](Self::needs_request) is `false`, and must decide as
    /// [`classify`](Self::classify) would. The default calls a response a
    /// success and an error final.
    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        match result {
            Ok(_) => Decision::Success,
            Err(_) => Decision::Final,
        }
    }

    /// Called once for each retry as it goes out (after its sleep and the
    /// service's readiness, once the budget paid for it), never for a retry
    /// that was stopped, with the copy about to be sent and the outcome it
    /// replaces: the place to stamp the attempt number into a header (gRPC's
    /// `grpc-previous-rpc-attempts`), or to drain the replaced response's
    /// body so its connection goes back to the pool. Copies for later retries
    /// are made from the unstamped request. The default drops the replaced
    /// outcome.
    fn prepare_retry(&self, _retry: PrepareRetry<'_, Req, Res, E>) {}

    /// Called for each [hedge](crate::hedge) about to go out, with a fresh
    /// copy of the request and the attempt number it will have (a hedge of
    /// the first attempt is attempt 2): whether this copy may go out while
    /// another is still pending, and the place to stamp it. Only a layer
    /// built with hedging calls it. The default lets every copy the policy
    /// made go out; the HTTP policy lets out idempotent requests and those
    /// with an `Idempotency-Key` only, and the gRPC policy stamps
    /// `grpc-previous-rpc-attempts`.
    fn prepare_hedge(&self, _copy: &mut Req, _attempt: u32) -> bool {
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
    fn needs_request(&self) -> bool {
        (**self).needs_request()
    }
    fn classify_outcome(&self, result: &Result<Res, E>) -> Decision {
        (**self).classify_outcome(result)
    }
    fn prepare_retry(&self, retry: PrepareRetry<'_, Req, Res, E>) {
        (**self).prepare_retry(retry)
    }
    fn prepare_hedge(&self, copy: &mut Req, attempt: u32) -> bool {
        (**self).prepare_hedge(copy, attempt)
    }
}

/// A retry going out, as [`Policy::prepare_retry`] sees it: the copy of the
/// request about to be sent, the outcome it replaces (owned: the policy may
/// drain it or keep what it needs, and drops it), and the engine's
/// [`RetryArgs`] (the number of the attempt that failed, the delay slept, the
/// cause).
#[derive(Debug)]
pub struct PrepareRetry<'a, Req, Res, E> {
    request: &'a mut Req,
    replaced: Result<Res, E>,
    args: RetryArgs,
}

impl<'a, Req, Res, E> PrepareRetry<'a, Req, Res, E> {
    /// The retry `args` of `request`, replacing `replaced`.
    pub fn new(request: &'a mut Req, replaced: Result<Res, E>, args: RetryArgs) -> Self {
        Self {
            request,
            replaced,
            args,
        }
    }

    /// The copy of the request about to go out.
    pub fn request(&self) -> &Req {
        self.request
    }

    /// The copy of the request about to go out, to change before it is sent.
    pub fn request_mut(&mut self) -> &mut Req {
        self.request
    }

    /// The outcome this retry replaces.
    pub fn replaced(&self) -> &Result<Res, E> {
        &self.replaced
    }

    /// The outcome this retry replaces, taken; the request's copy is then
    /// no longer reachable.
    pub fn into_replaced(self) -> Result<Res, E> {
        self.replaced
    }

    /// The request's copy, the replaced outcome and the retry's args, apart:
    /// how a policy over a wrapper of a request hands the retry on to the
    /// policy of the request inside.
    pub fn into_parts(self) -> (&'a mut Req, Result<Res, E>, RetryArgs) {
        (self.request, self.replaced, self.args)
    }

    /// What the engine knows of this retry: the same value the observers
    /// hear as [`Event::Retry`](crate::events::Event::Retry).
    pub fn args(&self) -> &RetryArgs {
        &self.args
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
/// later; [`BackoffRetry::retry_if`](crate::BackoffRetry::retry_if) on a wrapped service
/// infers it instead:
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
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
/// [`BackoffRetry::classify`](crate::BackoffRetry::classify) on a wrapped service does
/// the same with the argument types inferred.
///
/// ```
/// # extern crate tower_backoff_core as tower_backoff;
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

    fn clone_request(&self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

#[cfg(test)]
mod tests {
    // Mutation testing (issue 28) found these left untested by the
    // integration tests.
    use super::*;
    use crate::events::OutcomeKind;
    use crate::Cause;

    #[test]
    fn retry_limits_set_what_they_say() {
        assert_eq!(RetryLimits::new().max_attempts, None);
        assert_eq!(RetryLimits::no_retries().max_attempts, Some(1));
        assert_eq!(RetryLimits::new().max_attempts(5).max_attempts, Some(5));
        assert_eq!(RetryLimits::new().max_attempts(0).max_attempts, Some(1));
        let at = Instant::now() + Duration::from_secs(3);
        assert_eq!(RetryLimits::new().deadline(at).deadline, Some(at));
        let before = Instant::now();
        let deadline = RetryLimits::new()
            .timeout(Duration::from_secs(2))
            .deadline
            .unwrap();
        assert!(deadline >= before + Duration::from_secs(2));
        assert!(deadline <= Instant::now() + Duration::from_secs(2));
    }

    #[test]
    fn an_enormous_timeout_is_a_deadline_far_ahead() {
        let before = Instant::now();
        let deadline = RetryLimits::new().timeout(Duration::MAX).deadline.unwrap();
        assert!(deadline >= before + crate::error::MAX_DURATION);
    }

    /// Counts the retries it prepares into the request.
    struct Stamp;

    impl Policy<u32, (), ()> for Stamp {
        fn classify(&self, _: &u32, _: &Result<(), ()>) -> Decision {
            Decision::Success
        }
        fn clone_request(&self, request: &u32) -> Option<u32> {
            Some(*request)
        }
        fn prepare_retry(&self, mut retry: PrepareRetry<'_, u32, (), ()>) {
            *retry.request_mut() += 1;
        }
        /// Stamps the attempt number; lets out the first hedge only.
        fn prepare_hedge(&self, copy: &mut u32, attempt: u32) -> bool {
            *copy = attempt;
            attempt == 2
        }
    }

    /// Overrides nothing it need not.
    struct Plain;

    impl Policy<u32, (), ()> for Plain {
        fn classify(&self, _: &u32, _: &Result<(), ()>) -> Decision {
            Decision::Success
        }
        fn clone_request(&self, request: &u32) -> Option<u32> {
            Some(*request)
        }
    }

    #[test]
    fn by_default_every_hedge_goes_out_unchanged() {
        let mut copy = 7;
        assert!(Policy::<_, (), ()>::prepare_hedge(&Plain, &mut copy, 2));
        assert!(Policy::<_, (), ()>::prepare_hedge(&Plain, &mut copy, 5));
        assert_eq!(copy, 7);
    }

    #[test]
    fn an_arc_forwards_prepare_hedge() {
        let policy = Arc::new(Stamp);
        let mut copy = 0;
        assert!(Policy::prepare_hedge(&policy, &mut copy, 2));
        assert_eq!(copy, 2);
        assert!(!Policy::prepare_hedge(&policy, &mut copy, 3));
        assert_eq!(copy, 3);
    }

    #[test]
    fn an_arc_forwards_prepare_retry() {
        let policy = Arc::new(Stamp);
        let mut request = 0;
        let args = RetryArgs::new(1, Duration::ZERO, Cause::Transient, OutcomeKind::Response);
        Policy::prepare_retry(&policy, PrepareRetry::new(&mut request, Ok(()), args));
        assert_eq!(request, 1);
    }

    #[test]
    fn closure_policies_name_themselves_in_debug() {
        let retry = retry_if(|_: &Result<(), ()>| true);
        assert_eq!(format!("{retry:?}"), "RetryIf");
        let classify = classify_fn(|_: &(), _: &Result<(), ()>| Decision::Success);
        assert_eq!(format!("{classify:?}"), "ClassifyFn");
    }
}
