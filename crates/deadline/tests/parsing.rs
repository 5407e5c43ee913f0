//! Header formats: `grpc-timeout` and `x-request-timeout-ms`, formatted exactly and parsed totally.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use stormguard_classify::headers::{
    GRPC_TIMEOUT, X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, X_REQUEST_TIMEOUT_MS,
};
use stormguard_deadline::propagate::{
    format_grpc_timeout, format_timeout_ms, incoming_timeout, parse_grpc_timeout, parse_timeout_ms,
};

/// Length of one unit of a formatted `grpc-timeout`.
fn unit_of(value: &HeaderValue) -> Duration {
    match value.as_bytes().last() {
        Some(b'n') => Duration::from_nanos(1),
        Some(b'u') => Duration::from_micros(1),
        Some(b'm') => Duration::from_millis(1),
        Some(b'S') => Duration::from_secs(1),
        Some(b'M') => Duration::from_secs(60),
        Some(b'H') => Duration::from_secs(3600),
        other => panic!("unexpected unit {other:?}"),
    }
}

#[test]
fn grpc_timeout_uses_the_finest_unit_that_fits_in_eight_digits() {
    let cases = [
        (Duration::ZERO, "0n"),
        (Duration::from_nanos(99_999_999), "99999999n"),
        (Duration::from_nanos(100_000_000), "100000u"),
        (Duration::from_millis(250), "250000u"),
        (Duration::from_nanos(123_456_789), "123456u"),
        (Duration::from_secs(99), "99000000u"),
        (Duration::from_secs(100), "100000m"),
        (Duration::from_secs(99_999), "99999000m"),
        (Duration::from_secs(100_000), "100000S"),
        (Duration::from_secs(100_000_000), "1666666M"),
        (Duration::from_secs(5_999_999_940), "99999999M"),
        (Duration::from_secs(6_000_000_000), "1666666H"),
        (Duration::from_secs(6_000_000_060), "1666666H"),
        (Duration::MAX, "99999999H"),
    ];
    for (duration, expected) in cases {
        assert_eq!(format_grpc_timeout(duration), expected, "{duration:?}");
    }
}

#[test]
fn grpc_timeout_parses_every_unit() {
    let cases: [(&[u8], Duration); 7] = [
        (b"1H", Duration::from_secs(3600)),
        (b"2M", Duration::from_secs(120)),
        (b"30S", Duration::from_secs(30)),
        (b"1500m", Duration::from_millis(1500)),
        (b"250u", Duration::from_micros(250)),
        (b"99999999n", Duration::from_nanos(99_999_999)),
        (b"0m", Duration::ZERO),
    ];
    for (value, expected) in cases {
        assert_eq!(parse_grpc_timeout(value), Some(expected), "{value:?}");
    }
}

#[test]
fn hostile_values_are_rejected_not_panicked_on() {
    let ten_kb = "9".repeat(10 * 1024);
    let hostile: Vec<&[u8]> = vec![
        b"99999999999S",
        b"123456789m",
        b"-1m",
        b"+1m",
        b"10X",
        b"10",
        b"S",
        b"",
        b" ",
        b"1.5S",
        b"1e3m",
        b"0x10S",
        b"\xff\xfe1S",
        b"1S\x00",
        b"10 S",
        "\u{0661}S".as_bytes(), // Arabic-Indic digit one
        ten_kb.as_bytes(),
    ];
    for value in &hostile {
        assert_eq!(parse_grpc_timeout(value), None, "grpc-timeout {value:?}");
    }
    let hostile_ms: Vec<&[u8]> = vec![
        b"-1",
        b"+5",
        b"1.5",
        b"1e3",
        b"10ms",
        b"",
        b"abc",
        b"inf",
        b"NaN",
        b"\xff\xfe",
        b"99999999999999999999999",
        b"18446744073709551616",
        ten_kb.as_bytes(),
    ];
    for value in &hostile_ms {
        assert_eq!(parse_timeout_ms(value), None, "ms {value:?}");
    }
    assert_eq!(
        parse_timeout_ms(b"18446744073709551615"),
        Some(Duration::from_millis(u64::MAX))
    );
    assert_eq!(parse_timeout_ms(b" 2000 "), Some(Duration::from_secs(2)));
}

#[test]
fn milliseconds_round_down() {
    assert_eq!(format_timeout_ms(Duration::from_micros(1_999_999)), "1999");
    assert_eq!(format_timeout_ms(Duration::ZERO), "0");
    assert_eq!(
        format_timeout_ms(Duration::MAX),
        u64::MAX.to_string().as_str()
    );
}

#[test]
fn alternating_values_and_units_render_correctly() {
    // Repeated, changed and repeated-again values each render as themselves.
    let sequence = [1500, 1500, 1501, 1500, 0, 0, 1500];
    for millis in sequence {
        let expected = millis.to_string();
        assert_eq!(
            format_timeout_ms(Duration::from_millis(millis)),
            expected.as_str()
        );
    }
    // 12,345,678 in two units: the same number renders with its own unit each time.
    for (duration, expected) in [
        (Duration::from_nanos(12_345_678), "12345678n"),
        (Duration::from_nanos(12_345_678), "12345678n"),
        (Duration::from_millis(12_345_678), "12345678m"),
        (Duration::from_millis(12_345_678), "12345678m"),
        (Duration::from_nanos(12_345_678), "12345678n"),
        (Duration::from_secs(100), "100000m"),
    ] {
        assert_eq!(format_grpc_timeout(duration), expected, "{duration:?}");
    }
}

#[test]
fn the_tightest_valid_incoming_header_wins_and_garbage_is_ignored() {
    let mut headers = HeaderMap::new();
    assert_eq!(incoming_timeout(&headers), None);
    headers.insert(X_REQUEST_TIMEOUT_MS, HeaderValue::from_static("5000"));
    headers.insert(GRPC_TIMEOUT, HeaderValue::from_static("3S"));
    headers.insert(
        X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
        HeaderValue::from_static("4000"),
    );
    assert_eq!(incoming_timeout(&headers), Some(Duration::from_secs(3)));
    headers.append(X_REQUEST_TIMEOUT_MS, HeaderValue::from_static("1200"));
    assert_eq!(
        incoming_timeout(&headers),
        Some(Duration::from_millis(1200))
    );

    let mut garbage = HeaderMap::new();
    garbage.insert(GRPC_TIMEOUT, HeaderValue::from_static("-1m"));
    garbage.insert(X_REQUEST_TIMEOUT_MS, HeaderValue::from_static("soon"));
    assert_eq!(incoming_timeout(&garbage), None);
    garbage.insert(
        X_ENVOY_EXPECTED_RQ_TIMEOUT_MS,
        HeaderValue::from_static("750"),
    );
    assert_eq!(incoming_timeout(&garbage), Some(Duration::from_millis(750)));
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=200_000_000_000).prop_map(Duration::from_nanos),
        (0u64..=10_000_000_000).prop_map(Duration::from_micros),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::MAX),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn parsing_arbitrary_bytes_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Some(d) = parse_grpc_timeout(&bytes) {
            prop_assert!(d <= Duration::from_secs(99_999_999 * 3600));
        }
        let _ = parse_timeout_ms(&bytes);
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let mut headers = HeaderMap::new();
            headers.insert(GRPC_TIMEOUT, value.clone());
            headers.insert(X_REQUEST_TIMEOUT_MS, value.clone());
            headers.insert(X_ENVOY_EXPECTED_RQ_TIMEOUT_MS, value);
            let _ = incoming_timeout(&headers);
        }
    }

    #[test]
    fn grpc_shaped_strings_parse_to_their_value(value in 0u64..=99_999_999, unit in 0usize..6) {
        let (letter, length) = [
            ('n', Duration::from_nanos(1)),
            ('u', Duration::from_micros(1)),
            ('m', Duration::from_millis(1)),
            ('S', Duration::from_secs(1)),
            ('M', Duration::from_secs(60)),
            ('H', Duration::from_secs(3600)),
        ][unit];
        let text = format!("{value}{letter}");
        prop_assert_eq!(parse_grpc_timeout(text.as_bytes()), Some(length * value as u32));
    }

    #[test]
    fn grpc_round_trip_never_extends_and_loses_less_than_a_unit(d in any_duration()) {
        let value = format_grpc_timeout(d);
        let digits = value.len() - 1;
        prop_assert!((1..=8).contains(&digits), "{value:?}");
        let parsed = parse_grpc_timeout(value.as_bytes());
        prop_assert!(parsed.is_some(), "{value:?} did not parse");
        let parsed = parsed.unwrap_or_default();
        prop_assert!(parsed <= d, "{value:?} extends {d:?}");
        if d < Duration::from_secs(99_999_999 * 3600) {
            prop_assert!(d - parsed < unit_of(&value), "{d:?} -> {value:?}");
        }
    }

    #[test]
    fn ms_round_trip_never_extends(d in any_duration()) {
        let value = format_timeout_ms(d);
        let parsed = parse_timeout_ms(value.as_bytes());
        prop_assert!(parsed.is_some());
        let parsed = parsed.unwrap_or_default();
        prop_assert!(parsed <= d);
        if d.as_millis() < u128::from(u64::MAX) {
            prop_assert!(d - parsed < Duration::from_millis(1));
        }
    }
}
