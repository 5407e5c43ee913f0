//! Durations as a service config writes them: proto3 JSON's `google.protobuf.Duration`.

use std::time::Duration;

/// Most seconds a `google.protobuf.Duration` holds: 10,000 years (`duration.proto`: "Range is
/// approximately +-10,000 years", exactly 315,576,000,000 s).
const MAX_SECONDS: u64 = 315_576_000_000;

/// Parses a proto3 JSON duration (`duration.proto`, "JSON Mapping"): decimal seconds with at
/// most nine fractional digits, ending in `s`: `"1s"`, `"1.5s"`, `"0.000340s"`. Negative
/// durations, exponents, signs, spaces, an empty integer or fraction part, more than nine
/// fractional digits and more than [`MAX_SECONDS`] are refused with what is wrong.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, &'static str> {
    let Some(number) = text.strip_suffix('s') else {
        return Err("must be a duration in seconds ending in `s`, like \"1.5s\"");
    };
    if number.starts_with('-') {
        return Err("must not be negative");
    }
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|fraction| !digits(fraction)) {
        return Err("must be a duration in seconds ending in `s`, like \"1.5s\"");
    }
    let fraction = fraction.unwrap_or("");
    if fraction.len() > 9 {
        return Err("must have at most 9 fractional digits (nanoseconds)");
    }
    // Leading zeros are allowed; the value, not the text, is bounded.
    let seconds = whole
        .trim_start_matches('0')
        .parse::<u64>()
        .ok()
        .or_else(|| whole.bytes().all(|b| b == b'0').then_some(0))
        .filter(|seconds| *seconds <= MAX_SECONDS)
        .ok_or("must be at most 315576000000s (10,000 years)")?;
    let mut nanos = 0u32;
    for position in 0..9 {
        let digit = fraction.as_bytes().get(position).map_or(0, |b| b - b'0');
        nanos = nanos * 10 + u32::from(digit);
    }
    Ok(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn proto3_durations() {
        let ok = |text: &str| parse_duration(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(ok("1s"), Duration::from_secs(1));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("0.000340s"), Duration::from_micros(340));
        assert_eq!(ok("0.000000001s"), Duration::from_nanos(1));
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("000.1s"), Duration::from_millis(100));
        assert_eq!(ok("315576000000s"), Duration::from_secs(MAX_SECONDS));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for text in [
            "", "s", "1", "1.5", "1ms", "1.s", ".5s", "1e3s", "+1s", " 1s", "1 s", "0x10s",
            "1.5.5s", "١s", "NaNs", "infs",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?}");
        }
        assert_eq!(parse_duration("-1s"), Err("must not be negative"));
        assert!(
            parse_duration("0.0000000001s")
                .unwrap_err()
                .contains("9 fractional")
        );
        assert!(
            parse_duration("315576000001s")
                .unwrap_err()
                .contains("at most")
        );
        assert!(
            parse_duration("99999999999999999999999999s")
                .unwrap_err()
                .contains("at most")
        );
    }
}
