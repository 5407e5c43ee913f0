//! The one parser of decimal numbers from the network: attempt counts, timeouts, hints.

use std::fmt;

/// Why a header's digits are not a number stormguard can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecimalError {
    /// Empty, or a byte that is not an ASCII digit (a sign, a dot, a space, a unit ...).
    NotANumber,
    /// Only digits, but more than a `u64` holds. Callers choose: no value (a hint, a timeout) or
    /// the largest one (an attempt count).
    TooLarge,
}

impl fmt::Display for DecimalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotANumber => "not a decimal number",
            Self::TooLarge => "decimal number too large",
        })
    }
}

impl std::error::Error for DecimalError {}

/// Parses `digits` as a non-negative decimal integer: ASCII digits only, nothing around them
/// (callers trim what their header allows). Never panics or overflows; it reads each byte once.
///
/// ```
/// use stormguard_numbers::decimal::{DecimalError, parse_decimal};
///
/// assert_eq!(parse_decimal(b"1500"), Ok(1500));
/// assert_eq!(parse_decimal(b"-5"), Err(DecimalError::NotANumber));
/// assert_eq!(parse_decimal(b""), Err(DecimalError::NotANumber));
/// assert_eq!(parse_decimal(&[b'9'; 30]), Err(DecimalError::TooLarge));
/// ```
pub fn parse_decimal(digits: &[u8]) -> Result<u64, DecimalError> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(DecimalError::NotANumber);
    }
    digits
        .iter()
        .try_fold(0_u64, |value, digit| {
            value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
        })
        .ok_or(DecimalError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_only_and_the_edges_of_u64() {
        assert_eq!(parse_decimal(b"0"), Ok(0));
        assert_eq!(parse_decimal(b"007"), Ok(7));
        assert_eq!(parse_decimal(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_decimal(b"18446744073709551616"),
            Err(DecimalError::TooLarge)
        );
        for text in [&b" 1"[..], b"1 ", b"+1", b"1.5", b"1e3", b"0x10", b"\xff"] {
            assert_eq!(
                parse_decimal(text),
                Err(DecimalError::NotANumber),
                "{text:?}"
            );
        }
        // A long run of garbage is refused as garbage, not as a large number.
        let mut long = vec![b'9'; 40];
        long.push(b'x');
        assert_eq!(parse_decimal(&long), Err(DecimalError::NotANumber));
    }
}
