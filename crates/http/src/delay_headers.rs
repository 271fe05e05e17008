//! [`DelayHeaders`]: which response headers may name the delay before a retry,
//! and how each is read.

use std::fmt;
use std::ops::BitOr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::retry_after::{parse_retry_after, trim, MAX_LEN};

/// `retry-after-ms`: milliseconds, sent by Azure OpenAI and honoured by the
/// OpenAI and Anthropic client libraries.
#[doc(hidden)]
pub const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
/// `RateLimit-Reset`: seconds until the quota resets (IETF draft
/// "RateLimit header fields for HTTP", versions up to 06).
#[doc(hidden)]
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `X-RateLimit-Reset`: the de-facto header before the draft; GitHub and
/// others send a Unix timestamp in it, others seconds.
#[doc(hidden)]
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A value at least this large is no delay in seconds (that would be 31
/// years) but a Unix timestamp in seconds: 10⁹ is September 2001.
/// `RateLimit-Remaining`: the quota left in the current window. A
/// `RateLimit-Reset` counts as a delay only when this is absent or `0`.
#[doc(hidden)]
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
/// `X-RateLimit-Remaining`, paired with `X-RateLimit-Reset` as
/// [`RATELIMIT_REMAINING`] is with `RateLimit-Reset`.
#[doc(hidden)]
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");

/// Whether a `*-Remaining` value says quota is left: a positive count. An
/// absent, zero or unreadable value leaves the reset in force, as a 429
/// without it means the quota is spent.
fn quota_left(remaining: Option<&HeaderValue>) -> bool {
    remaining
        .map(|value| trim(value.as_bytes()))
        .filter(|value| value.len() <= MAX_LEN && !value.is_empty())
        .filter(|value| value.iter().all(u8::is_ascii_digit))
        .is_some_and(|digits| digits.iter().any(|&digit| digit != b'0'))
}

const TIMESTAMP_SECONDS: f64 = 1e9;
/// A value at least this large is a Unix timestamp in milliseconds: 10¹² s
/// would be the year 33658.
const TIMESTAMP_MILLIS: f64 = 1e12;

/// The response headers the policy reads a server's delay from, as a set.
/// When several are present, the first usable one in this order wins:
/// `retry-after-ms`, `Retry-After`, `RateLimit-Reset`, `X-RateLimit-Reset`
/// (the most precise first, the de-facto last). An unusable one (malformed,
/// zero, in the past) is skipped, never trusted.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use tower_backoff::http::{DelayHeaders, HttpPolicy};
///
/// // Only the standard header, no rate-limit headers:
/// let policy = HttpPolicy::new().delay_headers(DelayHeaders::RETRY_AFTER);
/// assert!(!DelayHeaders::RETRY_AFTER.contains(DelayHeaders::RATELIMIT_RESET));
/// assert!(DelayHeaders::ALL.contains(DelayHeaders::RETRY_AFTER | DelayHeaders::RETRY_AFTER_MS));
/// # drop(policy);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DelayHeaders {
    bits: u8,
}

impl DelayHeaders {
    /// None: every delay comes from the schedule.
    pub const NONE: DelayHeaders = DelayHeaders { bits: 0 };
    /// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date, read
    /// by [`parse_retry_after`].
    pub const RETRY_AFTER: DelayHeaders = DelayHeaders { bits: 1 };
    /// `retry-after-ms`: milliseconds, a fraction allowed (`1500`, `1500.5`).
    pub const RETRY_AFTER_MS: DelayHeaders = DelayHeaders { bits: 2 };
    /// `RateLimit-Reset`: delta seconds, or a Unix timestamp when the value is
    /// clearly one (at least 10⁹; at least 10¹² is read as milliseconds).
    pub const RATELIMIT_RESET: DelayHeaders = DelayHeaders { bits: 4 };
    /// `X-RateLimit-Reset`, read as `RateLimit-Reset` is.
    pub const X_RATELIMIT_RESET: DelayHeaders = DelayHeaders { bits: 8 };
    /// All four: the default.
    pub const ALL: DelayHeaders = DelayHeaders { bits: 15 };

    /// Whether every header of `other` is in this set.
    pub const fn contains(self, other: DelayHeaders) -> bool {
        self.bits & other.bits == other.bits
    }

    /// The delay the first usable header of this set asks for, from `now`.
    /// `Some(Duration::MAX)` stands for "longer than anyone would wait".
    pub(super) fn delay(self, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
        if self.bits == 0 {
            return None;
        }
        let read = |set: DelayHeaders, name: &HeaderName| {
            self.contains(set).then(|| headers.get(name)).flatten()
        };
        read(Self::RETRY_AFTER_MS, &RETRY_AFTER_MS)
            .and_then(parse_retry_after_ms)
            .or_else(|| {
                read(Self::RETRY_AFTER, &RETRY_AFTER).and_then(|v| parse_retry_after(v, now))
            })
            // A reset is when the quota renews: a delay only once it is
            // spent. GitHub sends both on every response, with thousands left.
            .or_else(|| {
                read(Self::RATELIMIT_RESET, &RATELIMIT_RESET)
                    .filter(|_| !quota_left(headers.get(&RATELIMIT_REMAINING)))
                    .and_then(|v| parse_rate_limit_reset(v, now))
            })
            .or_else(|| {
                read(Self::X_RATELIMIT_RESET, &X_RATELIMIT_RESET)
                    .filter(|_| !quota_left(headers.get(&X_RATELIMIT_REMAINING)))
                    .and_then(|v| parse_rate_limit_reset(v, now))
            })
    }
}

impl BitOr for DelayHeaders {
    type Output = DelayHeaders;

    fn bitor(self, other: DelayHeaders) -> DelayHeaders {
        DelayHeaders {
            bits: self.bits | other.bits,
        }
    }
}

impl Default for DelayHeaders {
    fn default() -> Self {
        Self::ALL
    }
}

impl fmt::Debug for DelayHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::RETRY_AFTER_MS, "retry-after-ms"),
            (Self::RETRY_AFTER, "retry-after"),
            (Self::RATELIMIT_RESET, "ratelimit-reset"),
            (Self::X_RATELIMIT_RESET, "x-ratelimit-reset"),
        ];
        f.debug_set()
            .entries(
                names
                    .iter()
                    .filter(|(set, _)| self.contains(*set))
                    .map(|(_, name)| name),
            )
            .finish()
    }
}

/// The delay a `retry-after-ms` value asks for, or `None` when the schedule
/// should decide: malformed (`-5`, `1e3`, `abc`, over 64 bytes) or zero. An
/// enormous value saturates at `Duration::MAX`, for the policy to refuse.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tower_backoff::http::parse_retry_after_ms;
///
/// assert_eq!(parse_retry_after_ms(&HeaderValue::from_static("1500")), Some(Duration::from_millis(1500)));
/// assert_eq!(parse_retry_after_ms(&HeaderValue::from_static("-1")), None);
/// ```
#[doc(hidden)]
pub fn parse_retry_after_ms(value: &HeaderValue) -> Option<Duration> {
    let millis = number(value)?;
    // Divided as a `Duration`, exactly: `0.5 / 1000.0` is not a float.
    positive(Duration::try_from_secs_f64(millis).map_or(Duration::MAX, |d| d / 1000))
}

/// The delay a `RateLimit-Reset` or `X-RateLimit-Reset` value asks for, from
/// `now`, or `None` when the schedule should decide: malformed, zero, or a
/// timestamp not after `now`.
///
/// The value is delta seconds (`30`, `1.5`) unless it is clearly a Unix
/// timestamp: at least 10⁹ (September 2001; as a delay, 31 years) is read as
/// seconds since the epoch, at least 10¹² as milliseconds since the epoch.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use http::HeaderValue;
/// use tower_backoff::http::parse_rate_limit_reset;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// let value = |s: &'static str| HeaderValue::from_static(s);
/// assert_eq!(parse_rate_limit_reset(&value("30"), now), Some(Duration::from_secs(30)));
/// assert_eq!(parse_rate_limit_reset(&value("1700000060"), now), Some(Duration::from_secs(60)));
/// assert_eq!(parse_rate_limit_reset(&value("1699999999"), now), None); // past
/// ```
#[doc(hidden)]
pub fn parse_rate_limit_reset(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let n = number(value)?;
    let delay = if n >= TIMESTAMP_MILLIS {
        until(n / 1000.0, now)?
    } else if n >= TIMESTAMP_SECONDS {
        until(n, now)?
    } else {
        Duration::try_from_secs_f64(n).ok()?
    };
    positive(delay)
}

/// The time from `now` to the Unix time `seconds`, `None` if that is past.
fn until(seconds: f64, now: SystemTime) -> Option<Duration> {
    let Ok(at) = Duration::try_from_secs_f64(seconds) else {
        return Some(Duration::MAX);
    };
    let now = now.duration_since(UNIX_EPOCH).ok()?;
    at.checked_sub(now)
}

fn positive(delay: Duration) -> Option<Duration> {
    (!delay.is_zero()).then_some(delay)
}

/// A non-negative decimal number: digits, optionally a point and more digits.
/// No sign, exponent, `inf` or `NaN`, which `str::parse::<f64>` would accept.
fn number(value: &HeaderValue) -> Option<f64> {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_LEN {
        return None;
    }
    let value = trim(bytes);
    let (whole, fraction) = match value.iter().position(|&b| b == b'.') {
        Some(point) => (&value[..point], &value[point + 1..]),
        None => (value, &[][..]),
    };
    let digits = |part: &[u8]| part.iter().all(u8::is_ascii_digit);
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    // Only digits and one point: valid UTF-8 and a valid float (possibly
    // infinite, which the callers saturate).
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    fn ms(s: &str) -> Option<Duration> {
        parse_retry_after_ms(&value(s))
    }

    const NOW_SECS: u64 = 1_700_000_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn reset(s: &str) -> Option<Duration> {
        parse_rate_limit_reset(&value(s), now())
    }

    #[test]
    fn retry_after_ms_reads_milliseconds_and_fractions() {
        assert_eq!(ms("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(ms(" 20\t"), Some(Duration::from_millis(20)));
        assert_eq!(ms("0.5"), Some(Duration::from_micros(500)));
        assert_eq!(ms("1."), Some(Duration::from_millis(1)));
    }

    #[test]
    fn retry_after_ms_ignores_hostile_values() {
        for hostile in [
            "", "-5", "+5", "1e3", "inf", "NaN", ".5", "1.2.3", "abc", "5ms", "0", "0.0",
        ] {
            assert_eq!(ms(hostile), None, "{hostile:?}");
        }
        assert_eq!(ms(&"9".repeat(10_000)), None);
        assert_eq!(ms(&"1".repeat(65)), None);
    }

    #[test]
    fn retry_after_ms_saturates_enormous_values() {
        assert_eq!(ms(&"9".repeat(64)), Some(Duration::MAX));
        assert!(ms("999999999999999").unwrap() >= Duration::from_secs(999_999_999_999));
    }

    #[test]
    fn rate_limit_reset_reads_delta_seconds() {
        assert_eq!(reset("30"), Some(Duration::from_secs(30)));
        assert_eq!(reset("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(reset("999999999"), Some(Duration::from_secs(999_999_999)));
    }

    #[test]
    fn rate_limit_reset_reads_unix_timestamps_in_seconds_and_milliseconds() {
        assert_eq!(reset("1700000060"), Some(Duration::from_secs(60)));
        assert_eq!(reset("1700000000.25"), Some(Duration::from_millis(250)));
        assert_eq!(reset("1700000002000"), Some(Duration::from_secs(2)));
        assert_eq!(reset("1000000000"), None, "2001 is past");
        assert_eq!(reset("1700000000"), None, "now is not later");
        assert_eq!(reset("1699999999999"), None);
    }

    #[test]
    fn rate_limit_reset_ignores_hostile_values() {
        for hostile in ["", "-30", "1e9", "inf", "soon", "0", "30s"] {
            assert_eq!(reset(hostile), None, "{hostile:?}");
        }
        assert_eq!(reset(&"9".repeat(10_000)), None);
        // A far-future timestamp is enormous, not garbage.
        assert_eq!(reset(&"9".repeat(64)), Some(Duration::MAX));
    }

    #[test]
    fn a_timestamp_before_the_clock_starts_is_ignored() {
        assert_eq!(
            parse_rate_limit_reset(&value("1700000060"), UNIX_EPOCH - Duration::from_secs(1)),
            None
        );
    }

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, v)| ((*name).clone(), value(v)))
            .collect()
    }

    #[test]
    fn the_first_usable_header_in_precedence_order_wins() {
        let all = headers(&[
            (&RETRY_AFTER_MS, "250"),
            (&RETRY_AFTER, "2"),
            (&RATELIMIT_RESET, "3"),
            (&X_RATELIMIT_RESET, "4"),
        ]);
        let set = DelayHeaders::ALL;
        assert_eq!(set.delay(&all, now()), Some(Duration::from_millis(250)));
        let without_ms = DelayHeaders::RETRY_AFTER
            | DelayHeaders::RATELIMIT_RESET
            | DelayHeaders::X_RATELIMIT_RESET;
        assert_eq!(without_ms.delay(&all, now()), Some(Duration::from_secs(2)));
        let resets = DelayHeaders::RATELIMIT_RESET | DelayHeaders::X_RATELIMIT_RESET;
        assert_eq!(resets.delay(&all, now()), Some(Duration::from_secs(3)));
        assert_eq!(
            DelayHeaders::X_RATELIMIT_RESET.delay(&all, now()),
            Some(Duration::from_secs(4))
        );
        assert_eq!(DelayHeaders::NONE.delay(&all, now()), None);
    }

    #[test]
    fn an_unusable_header_gives_way_to_the_next() {
        let garbled = headers(&[
            (&RETRY_AFTER_MS, "soon"),
            (&RETRY_AFTER, "-1"),
            (&X_RATELIMIT_RESET, "7"),
        ]);
        assert_eq!(
            DelayHeaders::ALL.delay(&garbled, now()),
            Some(Duration::from_secs(7))
        );
        assert_eq!(DelayHeaders::ALL.delay(&HeaderMap::new(), now()), None);
    }

    #[test]
    fn debug_names_the_headers_in_the_set() {
        assert_eq!(
            format!(
                "{:?}",
                DelayHeaders::RETRY_AFTER | DelayHeaders::X_RATELIMIT_RESET
            ),
            r#"{"retry-after", "x-ratelimit-reset"}"#
        );
        assert_eq!(DelayHeaders::default(), DelayHeaders::ALL);
    }

    #[test]
    fn a_union_with_a_subset_changes_nothing() {
        assert_eq!(
            DelayHeaders::ALL | DelayHeaders::RETRY_AFTER,
            DelayHeaders::ALL
        );
        assert_eq!(
            DelayHeaders::RETRY_AFTER | DelayHeaders::RETRY_AFTER,
            DelayHeaders::RETRY_AFTER
        );
    }

    #[test]
    fn quota_is_left_only_for_a_positive_count() {
        let value = |s: &str| HeaderValue::from_str(s).unwrap();
        for left in ["1", "4999", " 12 ", "007"] {
            assert!(quota_left(Some(&value(left))), "{left:?}");
        }
        let long = "9".repeat(100);
        for spent in ["0", "000", "", "-3", "abc", "1.5", long.as_str()] {
            assert!(!quota_left(Some(&value(spent))), "{spent:?}");
        }
        assert!(!quota_left(None));
    }
}
