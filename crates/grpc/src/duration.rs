//! Durations as a gRPC service config writes them: proto3 JSON `"0.1s"`.

use std::time::Duration;

/// Reads a proto3 JSON duration: decimal seconds with an `s` suffix
/// (`"1s"`, `"0.1s"`, `"1.000340012s"`, and `".01s"` as gRPC-Go's own
/// examples write it), at most nine decimal places, optionally negative.
/// Returns `None` for anything else, including values past what
/// `Duration` holds. A negative value is returned as `Err` with its
/// magnitude, for the caller to reject by name.
pub(crate) fn parse_duration(text: &str) -> Option<Result<Duration, Duration>> {
    let number = text.strip_suffix('s')?;
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if fraction.len() > 9
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (number.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let seconds: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    let duration = Duration::new(seconds, nanos);
    Some(if negative && !duration.is_zero() {
        Err(duration)
    } else {
        Ok(duration)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto3_durations_parse() {
        for (text, expected) in [
            ("1s", Duration::from_secs(1)),
            ("0.1s", Duration::from_millis(100)),
            (".01s", Duration::from_millis(10)),
            ("0s", Duration::ZERO),
            ("1.000340012s", Duration::new(1, 340_012)),
            ("3.5s", Duration::from_millis(3500)),
        ] {
            assert_eq!(parse_duration(text), Some(Ok(expected)), "{text}");
        }
        assert_eq!(
            parse_duration("-0.5s"),
            Some(Err(Duration::from_millis(500)))
        );
    }

    #[test]
    fn anything_else_is_rejected() {
        for text in [
            "",
            "s",
            "1",
            "1ms",
            "1.s",
            ".s",
            "-s",
            "1.0000000001s",
            "+1s",
            " 1s",
            "1 s",
            "1e3s",
            "0x10s",
            "99999999999999999999999s",
            "1.5sec",
        ] {
            assert_eq!(parse_duration(text), None, "{text:?}");
        }
    }
}
