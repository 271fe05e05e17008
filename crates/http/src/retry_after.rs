//! Reading the `Retry-After` header without trusting it blindly.

use std::time::{Duration, SystemTime};

use ::http::HeaderValue;

/// Longest value worth parsing. An IMF-fixdate is 29 bytes, the obsolete
/// RFC 850 and asctime forms are shorter than 40; no sane delay in seconds has
/// more than 20 digits. Anything longer is rejected before it is looked at, so
/// a 10,000-byte header costs one length check.
pub(super) const MAX_LEN: usize = 64;

/// The delay a `Retry-After` value asks for, measured from `now`, or `None`
/// when the schedule should decide instead.
///
/// Both forms of RFC 9110 §10.2.3 are read: delay-seconds (`120`) and an
/// HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, parsed by `httpdate`, so with
/// its one-second precision). `0` is `Some(Duration::ZERO)`: "retry now", as
/// RFC 9110 says. `None` is returned for:
/// - a malformed value: `-5`, `1.5`, `abc`, an empty string, anything over
///   64 bytes;
/// - a date that is not after `now`: a server whose clock is behind names no
///   wait worth trusting, and the schedule's jittered delay spreads clients
///   out where an immediate retry from all of them would not.
///
/// An enormous value is returned as it is, and digits that overflow a `u64`
/// as `Duration::MAX`: the server did say "not before then", and it is the
/// policy that decides how long a wait it accepts
/// ([`HttpPolicy::max_server_delay`](super::HttpPolicy::max_server_delay)),
/// giving up at once past it rather than retrying early.
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod http { pub use tower_backoff_http::*; } }
/// use std::time::{Duration, SystemTime};
/// use http::HeaderValue;
/// use tower_backoff::http::parse_retry_after;
///
/// let now = SystemTime::now();
/// assert_eq!(
///     parse_retry_after(&HeaderValue::from_static("2"), now),
///     Some(Duration::from_secs(2))
/// );
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("0"), now), Some(Duration::ZERO));
/// assert_eq!(parse_retry_after(&HeaderValue::from_static("-5"), now), None);
///
/// let in_a_minute = httpdate::fmt_http_date(now + Duration::from_secs(60));
/// let wait = parse_retry_after(&HeaderValue::from_str(&in_a_minute).unwrap(), now).unwrap();
/// // The date is truncated to whole seconds.
/// assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
/// ```
pub fn parse_retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_LEN {
        return None;
    }
    let value = trim(bytes);
    if value.is_empty() {
        return None;
    }
    if value.iter().all(u8::is_ascii_digit) {
        return Some(seconds(value).map_or(Duration::MAX, Duration::from_secs));
    }
    let date = httpdate::parse_http_date(std::str::from_utf8(value).ok()?).ok()?;
    let delay = date.duration_since(now).ok()?;
    (!delay.is_zero()).then_some(delay)
}

/// Optional whitespace around a field value (RFC 9110 §5.5).
pub(super) fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

fn seconds(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Option<Duration> {
        parse_retry_after(&HeaderValue::from_str(value).unwrap(), SystemTime::now())
    }

    #[test]
    fn reads_delay_seconds() {
        assert_eq!(parse("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse(" 120\t"), Some(Duration::from_secs(120)));
        assert_eq!(parse("0007"), Some(Duration::from_secs(7)));
    }

    #[test]
    fn zero_means_retry_now() {
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse(" 000 "), Some(Duration::ZERO));
    }

    #[test]
    fn malformed_values_are_ignored() {
        for value in ["", "   ", "-5", "+5", "1.5", "abc", "5s", "1 2", "0x10"] {
            assert_eq!(parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn enormous_values_are_returned_for_the_policy_to_refuse() {
        assert_eq!(
            parse("999999999999"),
            Some(Duration::from_secs(999_999_999_999))
        );
        assert_eq!(
            parse(&u64::MAX.to_string()),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(parse("18446744073709551616"), Some(Duration::MAX)); // u64::MAX + 1
        assert_eq!(parse(&"9".repeat(64)), Some(Duration::MAX));
    }

    #[test]
    fn values_longer_than_64_bytes_are_rejected_unread() {
        assert_eq!(parse(&"9".repeat(10_000)), None);
        assert_eq!(parse(&format!("{}1", " ".repeat(64))), None);
        // Leading zeros do not make a short delay enormous, up to the limit.
        assert_eq!(
            parse(&format!("{}1", "0".repeat(63))),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn reads_a_future_http_date_in_whole_seconds() {
        let now = SystemTime::now();
        let date = httpdate::fmt_http_date(now + Duration::from_secs(2));
        let wait = parse_retry_after(&HeaderValue::from_str(&date).unwrap(), now).unwrap();
        assert!(wait > Duration::from_secs(1), "{wait:?}");
        assert!(wait <= Duration::from_secs(2), "{wait:?}");
    }

    #[test]
    fn reads_the_obsolete_date_forms() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:30 GMT").unwrap();
        let ten = Some(Duration::from_secs(10));
        let at = |v: &str| parse_retry_after(&HeaderValue::from_str(v).unwrap(), now);
        assert_eq!(at("Sun, 06 Nov 1994 08:49:40 GMT"), ten);
        assert_eq!(at("Sunday, 06-Nov-94 08:49:40 GMT"), ten);
        assert_eq!(at("Sun Nov  6 08:49:40 1994"), ten);
    }

    #[test]
    fn a_past_or_present_date_leaves_the_delay_to_the_schedule() {
        let now = SystemTime::now();
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&HeaderValue::from_str(&past).unwrap(), now),
            None
        );
        assert_eq!(parse("Thu, 01 Jan 1970 00:00:00 GMT"), None);
    }

    #[test]
    fn a_malformed_date_is_ignored() {
        assert_eq!(parse("Wed, 32 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse("tomorrow"), None);
    }

    #[test]
    fn non_utf8_bytes_are_ignored() {
        let value = HeaderValue::from_bytes(b"Wed, 21 Oct 2015 \xff").unwrap();
        assert_eq!(parse_retry_after(&value, SystemTime::now()), None);
    }
}
