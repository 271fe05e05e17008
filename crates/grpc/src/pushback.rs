//! `grpc-retry-pushback-ms`: the server says when to retry, or not to.

use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName};

/// The metadata key a server sets to push back on retries (gRFC A6).
#[doc(hidden)]
pub const RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// What a response's `grpc-retry-pushback-ms` asks of the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pushback {
    /// No pushback: the retry policy's backoff decides.
    Absent,
    /// Retry after exactly this delay.
    After(Duration),
    /// Do not retry: the value was negative, malformed or given more than
    /// once.
    Stop,
}

/// Reads `grpc-retry-pushback-ms` from `headers`, as gRFC A6 defines it: an
/// ASCII signed 32-bit integer of milliseconds. A non-negative value is the
/// delay before the retry; a negative or unparseable value (or several
/// values, as gRPC-Go treats them) means "do not retry".
///
/// Only the parse happens here, bounded by the value's length: a hostile
/// value costs nothing and is never trusted beyond 2³¹ − 1 ms. Whether a
/// delay that long is worth waiting for is the policy's call
/// ([`GrpcPolicy::max_pushback`](super::GrpcPolicy::max_pushback)).
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_backoff::grpc::{parse_pushback, Pushback, RETRY_PUSHBACK_MS};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(parse_pushback(&headers), Pushback::Absent);
/// headers.insert(RETRY_PUSHBACK_MS, "250".parse().unwrap());
/// assert_eq!(parse_pushback(&headers), Pushback::After(Duration::from_millis(250)));
/// headers.insert(RETRY_PUSHBACK_MS, "-1".parse().unwrap());
/// assert_eq!(parse_pushback(&headers), Pushback::Stop);
/// ```
pub fn parse_pushback(headers: &HeaderMap) -> Pushback {
    let mut values = headers.get_all(RETRY_PUSHBACK_MS).iter();
    let Some(value) = values.next() else {
        return Pushback::Absent;
    };
    if values.next().is_some() {
        return Pushback::Stop;
    }
    match parse_i32(value.as_bytes()) {
        Some(ms) if ms >= 0 => Pushback::After(Duration::from_millis(ms as u64)),
        _ => Pushback::Stop,
    }
}

/// A decimal `i32` with an optional leading `-`, nothing else: no `+`, no
/// spaces, nothing past `i32`'s range.
fn parse_i32(bytes: &[u8]) -> Option<i32> {
    let (negative, digits) = match bytes {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let magnitude = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    let value = if negative { -magnitude } else { magnitude };
    i32::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pushback(values: &[&[u8]]) -> Pushback {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                RETRY_PUSHBACK_MS,
                ::http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        parse_pushback(&headers)
    }

    #[test]
    fn valid_values_are_delays() {
        assert_eq!(pushback(&[b"0"]), Pushback::After(Duration::ZERO));
        assert_eq!(
            pushback(&[b"1500"]),
            Pushback::After(Duration::from_millis(1500))
        );
        assert_eq!(
            pushback(&[b"2147483647"]),
            Pushback::After(Duration::from_millis(i32::MAX as u64))
        );
    }

    #[test]
    fn negative_malformed_and_repeated_values_stop() {
        for value in [
            &b"-1"[..],
            b"-2147483648",
            b"2147483648",
            b"99999999999999999999",
            b"",
            b"-",
            b"+5",
            b" 5",
            b"5 ",
            b"1.5",
            b"1e3",
            b"abc",
            b"\xff\xfe",
        ] {
            assert_eq!(pushback(&[value]), Pushback::Stop, "{value:?}");
        }
        assert_eq!(pushback(&[b"10", b"20"]), Pushback::Stop);
    }
}
