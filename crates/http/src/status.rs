//! [`StatusSet`]: which response statuses are worth another attempt.

use std::fmt;
use std::ops::RangeInclusive;

use ::http::StatusCode;

const FIRST: u16 = 100;
const LAST: u16 = 599;
const WORDS: usize = ((LAST - FIRST) as usize + 1).div_ceil(64);

/// A set of HTTP statuses, stored as a bitmap of 100..=599 (64 bytes, `Copy`,
/// no allocation, a lookup is a shift and a mask).
///
/// Codes from 600 to 999 are not HTTP statuses (RFC 9110 §15 defines only
/// 1xx to 5xx): they are never in a set, and adding them has no effect.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use http::StatusCode;
/// use tower_backoff::http::StatusSet;
///
/// let set = StatusSet::DEFAULT.with(StatusCode::INTERNAL_SERVER_ERROR);
/// assert!(set.contains(StatusCode::SERVICE_UNAVAILABLE));
/// assert!(set.contains(StatusCode::INTERNAL_SERVER_ERROR));
/// assert!(!set.contains(StatusCode::NOT_FOUND));
///
/// let all_5xx = StatusSet::EMPTY.with_range(500..=599);
/// assert!(all_5xx.contains(StatusCode::from_u16(599).unwrap()));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusSet {
    bits: [u64; WORDS],
}

impl StatusSet {
    /// No status at all.
    pub const EMPTY: StatusSet = StatusSet { bits: [0; WORDS] };

    /// 408 Request Timeout, 429 Too Many Requests, 502 Bad Gateway,
    /// 503 Service Unavailable and 504 Gateway Timeout: the statuses that say
    /// "not now" rather than "not this". 500 is left out: it usually means a bug
    /// that the same request will hit again.
    pub const DEFAULT: StatusSet = StatusSet::EMPTY
        .with(StatusCode::REQUEST_TIMEOUT)
        .with(StatusCode::TOO_MANY_REQUESTS)
        .with(StatusCode::BAD_GATEWAY)
        .with(StatusCode::SERVICE_UNAVAILABLE)
        .with(StatusCode::GATEWAY_TIMEOUT);

    /// This set plus `status`.
    pub const fn with(mut self, status: StatusCode) -> Self {
        if let Some((word, bit)) = slot(status.as_u16()) {
            self.bits[word] |= bit;
        }
        self
    }

    /// This set without `status`.
    pub const fn without(mut self, status: StatusCode) -> Self {
        if let Some((word, bit)) = slot(status.as_u16()) {
            self.bits[word] &= !bit;
        }
        self
    }

    /// This set plus every code in `range` (`500..=599` for all server
    /// errors). Codes outside 100..=599 are skipped.
    pub const fn with_range(mut self, range: RangeInclusive<u16>) -> Self {
        let mut code = if *range.start() < FIRST {
            FIRST
        } else {
            *range.start()
        };
        let end = if *range.end() > LAST {
            LAST
        } else {
            *range.end()
        };
        while code <= end {
            if let Some((word, bit)) = slot(code) {
                self.bits[word] |= bit;
            }
            code += 1;
        }
        self
    }

    /// Whether `status` is in the set.
    pub const fn contains(&self, status: StatusCode) -> bool {
        match slot(status.as_u16()) {
            Some((word, bit)) => self.bits[word] & bit != 0,
            None => false,
        }
    }

    /// Whether the set holds no status.
    pub const fn is_empty(&self) -> bool {
        let mut i = 0;
        while i < WORDS {
            if self.bits[i] != 0 {
                return false;
            }
            i += 1;
        }
        true
    }

    /// The statuses in the set, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = StatusCode> + '_ {
        (FIRST..=LAST)
            .filter(|&code| {
                let (word, bit) = slot(code).expect("in range");
                self.bits[word] & bit != 0
            })
            .filter_map(|code| StatusCode::from_u16(code).ok())
    }
}

impl Default for StatusSet {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Debug for StatusSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.iter().map(|s| s.as_u16()))
            .finish()
    }
}

impl FromIterator<StatusCode> for StatusSet {
    fn from_iter<I: IntoIterator<Item = StatusCode>>(iter: I) -> Self {
        iter.into_iter().fold(StatusSet::EMPTY, StatusSet::with)
    }
}

const fn slot(code: u16) -> Option<(usize, u64)> {
    if code < FIRST || code > LAST {
        return None;
    }
    let index = (code - FIRST) as usize;
    Some((index / 64, 1 << (index % 64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(n: u16) -> StatusCode {
        StatusCode::from_u16(n).unwrap()
    }

    #[test]
    fn default_holds_exactly_the_transient_statuses() {
        let held: Vec<u16> = StatusSet::DEFAULT.iter().map(|s| s.as_u16()).collect();
        assert_eq!(held, [408, 429, 502, 503, 504]);
    }

    #[test]
    fn with_and_without_toggle_one_status() {
        let set = StatusSet::DEFAULT.with(code(500)).without(code(429));
        assert!(set.contains(code(500)));
        assert!(!set.contains(code(429)));
        assert!(set.contains(code(503)));
    }

    #[test]
    fn range_covers_its_ends_and_nothing_else() {
        let set = StatusSet::EMPTY.with_range(500..=504);
        assert!(!set.contains(code(499)));
        assert!(set.contains(code(500)));
        assert!(set.contains(code(504)));
        assert!(!set.contains(code(505)));
    }

    #[test]
    fn codes_outside_1xx_to_5xx_are_never_members() {
        let set = StatusSet::EMPTY.with(code(600)).with_range(0..=u16::MAX);
        assert!(!set.contains(code(600)));
        assert!(!set.contains(code(999)));
        assert!(set.contains(code(100)));
        assert!(set.contains(code(599)));
        assert_eq!(set.iter().count(), 500);
    }

    #[test]
    fn empty_range_adds_nothing() {
        #[allow(clippy::reversed_empty_ranges)]
        let set = StatusSet::EMPTY.with_range(504..=500);
        assert!(set.is_empty());
    }
}
