//! Property tests over arbitrary bytes for every header a server sends that
//! the crate reads, and for the gRPC service config: nothing panics, and every
//! delay stays within its documented bounds (issue 28).
#![cfg(all(feature = "http", feature = "grpc"))]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use proptest::prelude::*;
use tower_backoff::grpc::{parse_pushback, Pushback, ServiceConfig, RETRY_PUSHBACK_MS};
use tower_backoff::http::{
    parse_rate_limit_reset, parse_retry_after, parse_retry_after_ms, HttpPolicy,
    DEFAULT_MAX_SERVER_DELAY, DEFAULT_SERVER_JITTER_MAX,
};
use tower_backoff::{Decision, Policy};

/// What a server may put in a header value: any byte `http` accepts (visible
/// ASCII, spaces, tabs, obs-text), with digits, signs, dots and the parts of
/// an HTTP-date drawn often, at lengths around the parsers' 64-byte limit.
fn header_value() -> impl Strategy<Value = HeaderValue> {
    let byte = prop_oneof![
        4 => prop::sample::select(b"0123456789".to_vec()),
        1 => prop::sample::select(b"-+.eE ,:\tGMTMonWed".to_vec()),
        1 => 0x20u8..=0x7e,
        1 => 0x80u8..=0xff,
    ];
    prop_oneof![
        prop::collection::vec(byte, 0..80),
        (0u64..=u64::MAX).prop_map(|n| n.to_string().into_bytes()),
        (0u64..4_000_000_000).prop_map(|s| {
            httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(s)).into_bytes()
        }),
    ]
    .prop_filter_map("a valid header value", |bytes| {
        HeaderValue::from_bytes(&bytes).ok()
    })
}

/// A clock reading anywhere from 1970 to 2100.
fn now() -> impl Strategy<Value = SystemTime> {
    (0u64..4_102_444_800).prop_map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn retry_after_never_panics_and_reads_digits_as_seconds(value in header_value(), now in now()) {
        let parsed = parse_retry_after(&value, now);
        let bytes = value.as_bytes();
        let trimmed = std::str::from_utf8(bytes).map(|s| s.trim_matches([' ', '\t']));
        if bytes.len() > 64 {
            prop_assert_eq!(parsed, None);
        } else if let Ok(digits) = trimmed {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                let expected = digits.parse::<u64>().map_or(Duration::MAX, Duration::from_secs);
                prop_assert_eq!(parsed, Some(expected));
            }
        }
    }

    #[test]
    fn retry_after_ms_and_rate_limit_reset_never_panic(value in header_value(), now in now()) {
        if let Some(delay) = parse_retry_after_ms(&value) {
            prop_assert!(!delay.is_zero(), "zero leaves the delay to the schedule");
        }
        if let Some(delay) = parse_rate_limit_reset(&value, now) {
            prop_assert!(!delay.is_zero());
        }
        if value.as_bytes().len() > 64 {
            prop_assert_eq!(parse_retry_after_ms(&value), None);
            prop_assert_eq!(parse_rate_limit_reset(&value, now), None);
        }
    }

    /// Whatever a 503 carries, the HTTP policy either retries after at most
    /// `max_server_delay` plus its jitter, or gives up: never a longer wait.
    #[test]
    fn the_http_policy_never_waits_past_its_cap(
        values in prop::collection::vec(header_value(), 7),
        status in prop::sample::select(vec![429u16, 500, 502, 503, 504, 200, 404]),
    ) {
        let names = [
            "retry-after", "retry-after-ms", "ratelimit-reset", "x-ratelimit-reset",
            "ratelimit-remaining", "x-ratelimit-remaining", "x-should-retry",
        ];
        let mut response = Response::new(http_body_util::Empty::<bytes::Bytes>::new());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, value) in names.iter().zip(values) {
            response.headers_mut().insert(HeaderName::from_static(name), value);
        }
        let request = Request::get("http://example.test/").body(()).unwrap();
        let outcome: Result<_, std::io::Error> = Ok(response);
        let decision = Policy::classify(&HttpPolicy::new(), &request, &outcome);
        if let Decision::Retry { after: Some(delay), .. } = decision {
            prop_assert!(delay <= DEFAULT_MAX_SERVER_DELAY + DEFAULT_SERVER_JITTER_MAX, "{delay:?}");
        }
    }

    #[test]
    fn pushback_never_panics_and_stays_within_i32_millis(values in prop::collection::vec(header_value(), 0..3)) {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(RETRY_PUSHBACK_MS, value);
        }
        if let Pushback::After(delay) = parse_pushback(&headers) {
            prop_assert!(delay <= Duration::from_millis(i32::MAX as u64));
        }
    }

    /// Any text, and any mutation of a valid config: an error naming what is
    /// wrong, or a config whose attempts stay within A6's limit of 5.
    #[test]
    fn the_service_config_never_panics(text in ".{0,200}", cut in 0usize..400, junk in ".{0,8}") {
        let _ = ServiceConfig::from_json(&text);
        let valid = r#"{"methodConfig": [{"name": [{"service": "pkg.Svc"}],
            "retryPolicy": {"maxAttempts": 9, "initialBackoff": "0.1s", "maxBackoff": "1s",
            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
            "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;
        let at = valid.char_indices().map(|(i, _)| i).nth(cut % valid.chars().count()).unwrap_or(0);
        let mutated = format!("{}{}{}", &valid[..at], junk, &valid[at..]);
        match ServiceConfig::from_json(&mutated) {
            Ok(config) => {
                if let Some(retry) = config.retry_config("/pkg.Svc/Any") {
                    prop_assert!(retry.max_attempts() <= 5);
                }
            }
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }

    /// The same for a `hedgingPolicy`: an error, or at most 5 copies, a
    /// delay a timer can take, and never a retry policy beside it.
    #[test]
    fn the_hedging_policy_never_panics(cut in 0usize..400, junk in ".{0,8}") {
        let valid = r#"{"methodConfig": [{"name": [{"service": "pkg.Svc"}],
            "hedgingPolicy": {"maxAttempts": 9, "hedgingDelay": "0.05s",
            "nonFatalStatusCodes": ["UNAVAILABLE", 10]}}],
            "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;
        let at = valid.char_indices().map(|(i, _)| i).nth(cut % valid.chars().count()).unwrap_or(0);
        let mutated = format!("{}{}{}", &valid[..at], junk, &valid[at..]);
        match ServiceConfig::from_json(&mutated) {
            Ok(config) => {
                if let Some(hedging) = config.hedging_config("/pkg.Svc/Any") {
                    prop_assert!((2..=5).contains(&hedging.max_attempts()));
                    prop_assert!(hedging.hedging_delay() <= Duration::from_secs(365 * 86_400));
                    prop_assert!(config.retry_config("/pkg.Svc/Any").is_none());
                }
            }
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }
}
