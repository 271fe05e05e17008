//! [`Criticality`] and [`Priority`]: how much a request matters, as its
//! headers say, so that under overload the server sheds retries and
//! low-priority work first (Google SRE book, "Handling Overload").

use http::header::{HeaderMap, HeaderName};

/// The header a request names its criticality in: `critical`, `default` or
/// `sheddable` (any case; anything else is `default`).
#[doc(hidden)]
pub const X_CRITICALITY: HeaderName = HeaderName::from_static("x-criticality");

/// The attempt number tower-backoff's `HttpPolicy` stamps on every retry and
/// hedge (`2` on the second attempt). Absent on a first attempt.
#[doc(hidden)]
pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static("x-retry-attempt");

/// gRPC's retry marker (gRFC A6): attempts sent before this one.
#[doc(hidden)]
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// Envoy's attempt count (`1` on a first attempt).
#[doc(hidden)]
pub const X_ENVOY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// How much a request matters to its caller.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
/// use http::HeaderMap;
/// use tower_backoff::shed::Criticality;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("x-criticality", "Sheddable".parse().unwrap());
/// assert_eq!(Criticality::from_headers(&headers), Criticality::Sheddable);
/// assert_eq!(Criticality::from_headers(&HeaderMap::new()), Criticality::Default);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum Criticality {
    /// Work that may be dropped first: prefetches, batch jobs.
    Sheddable,
    /// Everything not marked otherwise.
    #[default]
    Default,
    /// Work a user waits for and that has no fallback: shed last.
    Critical,
}

impl Criticality {
    /// The criticality `headers` name in
    /// [`x-criticality`](crate::criticality::X_CRITICALITY); `Default` when
    /// absent or unknown.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let Some(value) = headers.get(&X_CRITICALITY) else {
            return Criticality::Default;
        };
        let value = value.as_bytes().trim_ascii();
        if value.eq_ignore_ascii_case(b"critical") {
            Criticality::Critical
        } else if value.eq_ignore_ascii_case(b"sheddable") {
            Criticality::Sheddable
        } else {
            Criticality::Default
        }
    }

    /// The name a header or a metric label gives it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Criticality::Sheddable => "sheddable",
            Criticality::Default => "default",
            Criticality::Critical => "critical",
        }
    }
}

/// A request's place in the shedding order: its [`Criticality`], one level
/// lower when it is a retry (or a hedge), since the first attempt of another
/// request is worth more than a repeat of one that already had its chance.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod shed { pub use tower_backoff_shed::*; } }
/// use tower_backoff::shed::{Criticality, Priority};
///
/// let first = Priority::new(Criticality::Default, false);
/// let retry = Priority::new(Criticality::Default, true);
/// assert!(retry < first);
/// assert_eq!(retry, Priority::new(Criticality::Sheddable, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(u8);

impl Priority {
    /// The lowest: a retry of sheddable work.
    pub const LOWEST: Priority = Priority(0);
    /// The highest: the first attempt of critical work.
    pub const HIGHEST: Priority = Priority(3);

    /// The priority of a request of `criticality`, a retry or not.
    pub const fn new(criticality: Criticality, retry: bool) -> Self {
        let level = match criticality {
            Criticality::Sheddable => 1,
            Criticality::Default => 2,
            Criticality::Critical => 3,
        };
        Priority(if retry { level - 1 } else { level })
    }

    /// Reads a request's headers:
    /// [`x-criticality`](crate::criticality::X_CRITICALITY), and whether any
    /// of [`x-retry-attempt`](crate::criticality::X_RETRY_ATTEMPT),
    /// [`grpc-previous-rpc-attempts`](crate::criticality::GRPC_PREVIOUS_RPC_ATTEMPTS)
    /// or [`x-envoy-attempt-count`](crate::criticality::X_ENVOY_ATTEMPT_COUNT)
    /// marks it as a retry.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        Priority::new(Criticality::from_headers(headers), is_retry(headers))
    }

    /// From 0 ([`LOWEST`](Self::LOWEST)) to 3 ([`HIGHEST`](Self::HIGHEST)).
    pub const fn level(self) -> u8 {
        self.0
    }
}

/// Whether the headers mark a retry: an attempt number above 1, or any
/// earlier attempt. A malformed value is not trusted to mean anything.
#[doc(hidden)]
pub fn is_retry(headers: &HeaderMap) -> bool {
    let number = |name: &HeaderName| {
        headers
            .get(name)
            .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    number(&X_RETRY_ATTEMPT).is_some_and(|n| n > 1)
        || number(&GRPC_PREVIOUS_RPC_ATTEMPTS).is_some_and(|n| n > 0)
        || number(&X_ENVOY_ATTEMPT_COUNT).is_some_and(|n| n > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &str, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        headers
    }

    #[test]
    fn each_retry_marker_lowers_the_priority_by_one_level() {
        let first = Priority::from_headers(&HeaderMap::new());
        for (name, value) in [
            ("x-retry-attempt", "2"),
            ("grpc-previous-rpc-attempts", "1"),
            ("x-envoy-attempt-count", "3"),
        ] {
            let retry = Priority::from_headers(&with(name, value));
            assert_eq!(retry.level() + 1, first.level(), "{name}");
        }
    }

    #[test]
    fn first_attempt_markers_and_garbage_are_not_retries() {
        for (name, value) in [
            ("x-retry-attempt", "1"),
            ("grpc-previous-rpc-attempts", "0"),
            ("x-envoy-attempt-count", "1"),
            ("x-retry-attempt", "-4"),
            ("x-retry-attempt", "lots"),
            ("grpc-previous-rpc-attempts", "99999999999999999999999"),
        ] {
            assert!(!is_retry(&with(name, value)), "{name}: {value}");
        }
    }

    #[test]
    fn a_retry_of_critical_work_ranks_with_first_attempts_of_default_work() {
        assert_eq!(
            Priority::new(Criticality::Critical, true),
            Priority::new(Criticality::Default, false)
        );
        assert_eq!(
            Priority::new(Criticality::Sheddable, true),
            Priority::LOWEST
        );
        assert_eq!(
            Priority::new(Criticality::Critical, false),
            Priority::HIGHEST
        );
    }

    #[test]
    fn criticality_reads_any_case_and_defaults_otherwise() {
        assert_eq!(
            Criticality::from_headers(&with("x-criticality", " CRITICAL ")),
            Criticality::Critical
        );
        assert_eq!(
            Criticality::from_headers(&with("x-criticality", "urgent!!")),
            Criticality::Default
        );
    }
}
