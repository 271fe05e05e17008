//! `grpc-timeout`: the call's deadline, as the caller's client sends it.

use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

/// The metadata key that carries a call's deadline, as time left (gRPC over
/// HTTP/2): what tonic's `Request::set_timeout` sends.
#[doc(hidden)]
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The most digits a `grpc-timeout` value may have.
const MAX_DIGITS: usize = 8;

/// The largest value that fits those digits.
const MAX_VALUE: u64 = 99_999_999;

/// Reads `grpc-timeout` from `headers` as the gRPC over HTTP/2 protocol
/// defines it: 1 to 8 ASCII digits and a unit, `H` (hours), `M` (minutes),
/// `S`, `m` (milliseconds), `u` (microseconds) or `n` (nanoseconds).
///
/// Anything else is `None`, as if the caller had set no deadline: no value,
/// several values, a sign, a space, a ninth digit, another unit or any
/// other byte. The parse is bounded by the value's length and never
/// overflows (the longest, `99999999H`, is about 11,400 years).
///
/// ```
/// # mod tower_backoff { pub use tower_backoff_core::*; pub mod grpc { pub use tower_backoff_grpc::*; } }
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_backoff::grpc::{parse_grpc_timeout, GRPC_TIMEOUT};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(parse_grpc_timeout(&headers), None);
/// headers.insert(GRPC_TIMEOUT, "500000u".parse().unwrap());
/// assert_eq!(parse_grpc_timeout(&headers), Some(Duration::from_millis(500)));
/// headers.insert(GRPC_TIMEOUT, "123456789m".parse().unwrap());
/// assert_eq!(parse_grpc_timeout(&headers), None, "nine digits");
/// ```
pub fn parse_grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let mut values = headers.get_all(GRPC_TIMEOUT).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `left` as a `grpc-timeout` value: in the finest unit whose count fits 8
/// digits, cut down to it (as tonic writes it), at most `99999999H`.
pub(crate) fn encode_grpc_timeout(left: Duration) -> HeaderValue {
    let secs = left.as_secs();
    let units = [
        (left.as_nanos(), 'n'),
        (left.as_micros(), 'u'),
        (left.as_millis(), 'm'),
        (u128::from(secs), 'S'),
        (u128::from(secs / 60), 'M'),
    ];
    let (count, unit) = units
        .into_iter()
        .find(|(count, _)| *count <= u128::from(MAX_VALUE))
        .unwrap_or((u128::from((secs / 3600).min(MAX_VALUE)), 'H'));
    HeaderValue::from_str(&format!("{count}{unit}")).expect("digits and a letter")
}

/// The call's deadline, read once from its `grpc-timeout` when the call
/// started: kept in the request's extensions (every attempt's copy has it),
/// for the policy to write the time left into each retry and hedge, to stop
/// retrying once it passed and to let it bound a pushback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallDeadline(pub(crate) Instant);

impl CallDeadline {
    /// The deadline of a call whose `grpc-timeout` says `left` now; `None`
    /// when it is too far to count (past what an `Instant` holds).
    pub(crate) fn after(left: Duration) -> Option<Self> {
        Instant::now().checked_add(left).map(Self)
    }

    /// Whether it has passed at `now` (reached counts).
    pub(crate) fn has_passed(self, now: Instant) -> bool {
        now >= self.0
    }

    /// Writes the time left now into `headers`' `grpc-timeout`.
    pub(crate) fn stamp(self, headers: &mut HeaderMap) {
        let left = self.0.saturating_duration_since(Instant::now());
        headers.insert(GRPC_TIMEOUT, encode_grpc_timeout(left));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&[u8]]) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(GRPC_TIMEOUT, HeaderValue::from_bytes(value).unwrap());
        }
        parse_grpc_timeout(&headers)
    }

    #[test]
    fn every_unit_is_read() {
        assert_eq!(parse(&[b"2H"]), Some(Duration::from_secs(7200)));
        assert_eq!(parse(&[b"3M"]), Some(Duration::from_secs(180)));
        assert_eq!(parse(&[b"4S"]), Some(Duration::from_secs(4)));
        assert_eq!(parse(&[b"500m"]), Some(Duration::from_millis(500)));
        assert_eq!(parse(&[b"7u"]), Some(Duration::from_micros(7)));
        assert_eq!(
            parse(&[b"99999999n"]),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse(&[b"0m"]), Some(Duration::ZERO));
        assert_eq!(
            parse(&[b"99999999H"]),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn malformed_and_hostile_values_are_no_deadline() {
        for value in [
            &b""[..],
            b"m",
            b"5",
            b"123456789m",
            b"000000001S",
            b"-5m",
            b"+5m",
            b" 5m",
            b"5m ",
            b"1.5S",
            b"5s",
            b"5h",
            b"5x",
            b"5mm",
            b"\xff\xfem",
            b"18446744073709551616n",
        ] {
            assert_eq!(parse(&[value]), None, "{value:?}");
        }
        assert_eq!(parse(&[b"1S", b"2S"]), None, "two values");
    }

    #[test]
    fn the_time_left_is_written_in_the_finest_unit_that_fits() {
        let encoded = |d: Duration| encode_grpc_timeout(d).to_str().unwrap().to_owned();
        assert_eq!(encoded(Duration::ZERO), "0n");
        assert_eq!(encoded(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(encoded(Duration::from_millis(148)), "148000u");
        assert_eq!(encoded(Duration::from_secs(5)), "5000000u");
        assert_eq!(encoded(Duration::from_secs(500)), "500000m");
        assert_eq!(encoded(Duration::from_secs(200_000)), "200000S");
        assert_eq!(encoded(Duration::from_secs(200_000_000)), "3333333M");
        assert_eq!(encoded(Duration::from_secs(60_000_000_000)), "16666666H");
        assert_eq!(encoded(Duration::MAX), "99999999H");
        for d in [
            Duration::from_millis(148),
            Duration::from_secs(5),
            Duration::from_secs(200_000),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(GRPC_TIMEOUT, encode_grpc_timeout(d));
            assert_eq!(parse_grpc_timeout(&headers), Some(d));
        }
    }
}
