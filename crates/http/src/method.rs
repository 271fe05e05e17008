//! [`MethodSet`]: which request methods may be sent more than once.

use std::fmt;

use ::http::Method;

static METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::OPTIONS,
    Method::TRACE,
    Method::PUT,
    Method::DELETE,
    Method::POST,
    Method::PATCH,
    Method::CONNECT,
];

/// A set of the nine standard HTTP methods, as a bitmap.
///
/// Extension methods (anything but the nine of RFC 9110 and RFC 5789) are never
/// members: the policy cannot know whether they are idempotent, so a request
/// using one is retried only with an `Idempotency-Key`.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use http::Method;
/// use tower_backoff::http::MethodSet;
///
/// let set = MethodSet::IDEMPOTENT.with(Method::POST);
/// assert!(set.contains(&Method::POST));
/// assert!(!MethodSet::IDEMPOTENT.contains(&Method::PATCH));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MethodSet {
    bits: u16,
}

impl MethodSet {
    /// No method: only requests with an idempotency key are retried.
    pub const EMPTY: MethodSet = MethodSet { bits: 0 };

    /// GET, HEAD, OPTIONS, TRACE, PUT and DELETE: the methods RFC 9110 §9.2.2
    /// defines as idempotent, so sending one twice has the effect of sending it
    /// once.
    pub const IDEMPOTENT: MethodSet = MethodSet { bits: 0b11_1111 };

    /// This set plus `method` (no effect for an extension method).
    pub fn with(mut self, method: Method) -> Self {
        self.bits |= bit(&method);
        self
    }

    /// This set without `method`.
    pub fn without(mut self, method: Method) -> Self {
        self.bits &= !bit(&method);
        self
    }

    /// Whether `method` is in the set.
    pub fn contains(&self, method: &Method) -> bool {
        self.bits & bit(method) != 0
    }

    /// The methods in the set.
    pub fn iter(&self) -> impl Iterator<Item = Method> + '_ {
        METHODS.iter().filter(|m| self.contains(m)).cloned()
    }
}

impl Default for MethodSet {
    fn default() -> Self {
        Self::IDEMPOTENT
    }
}

impl fmt::Debug for MethodSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl FromIterator<Method> for MethodSet {
    fn from_iter<I: IntoIterator<Item = Method>>(iter: I) -> Self {
        iter.into_iter().fold(MethodSet::EMPTY, MethodSet::with)
    }
}

fn bit(method: &Method) -> u16 {
    METHODS
        .iter()
        .position(|m| m == method)
        .map_or(0, |i| 1 << i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotent_holds_the_six_rfc_9110_methods() {
        let held: Vec<Method> = MethodSet::IDEMPOTENT.iter().collect();
        assert_eq!(
            held,
            [
                Method::GET,
                Method::HEAD,
                Method::OPTIONS,
                Method::TRACE,
                Method::PUT,
                Method::DELETE
            ]
        );
        assert!(!MethodSet::IDEMPOTENT.contains(&Method::POST));
        assert!(!MethodSet::IDEMPOTENT.contains(&Method::PATCH));
        assert!(!MethodSet::IDEMPOTENT.contains(&Method::CONNECT));
    }

    #[test]
    fn extension_methods_are_never_members() {
        let purge = Method::from_bytes(b"PURGE").unwrap();
        let set = MethodSet::IDEMPOTENT.with(purge.clone());
        assert!(!set.contains(&purge));
        assert_eq!(set, MethodSet::IDEMPOTENT);
    }

    #[test]
    fn without_removes_a_method() {
        let set = MethodSet::IDEMPOTENT.without(Method::DELETE);
        assert!(!set.contains(&Method::DELETE));
        assert!(set.contains(&Method::PUT));
    }
}
