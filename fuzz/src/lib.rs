//! Turns a fuzzer's bytes into the inputs stormguard's parsers see: header maps and bodies.
//!
//! Layout of one input: a count byte (headers = count % 16), then per header a name byte (an
//! index into the target's list of header names), a length byte and that many value bytes; what
//! is left is the body. Values the `http` crate refuses (control characters) are skipped, as a
//! server would never hand them over.

use http::{HeaderMap, HeaderName, HeaderValue};

/// Splits `data` into a header map (names taken from `names`) and the remaining bytes.
pub fn headers_and_rest<'a>(data: &'a [u8], names: &[HeaderName]) -> (HeaderMap, &'a [u8]) {
    let mut headers = HeaderMap::new();
    let Some((&count, mut rest)) = data.split_first() else {
        return (headers, data);
    };
    if names.is_empty() {
        return (headers, rest);
    }
    for _ in 0..count % 16 {
        let [name, length, tail @ ..] = rest else {
            break;
        };
        let length = usize::from(*length).min(tail.len());
        let (value, tail) = tail.split_at(length);
        rest = tail;
        if let Ok(value) = HeaderValue::from_bytes(value) {
            let name = &names[usize::from(*name) % names.len()];
            headers.append(name.clone(), value);
        }
    }
    (headers, rest)
}

/// The first 8 bytes as a little-endian `u64` (zero-padded), and the rest.
pub fn u64_and_rest(data: &[u8]) -> (u64, &[u8]) {
    let split = data.len().min(8);
    let (head, rest) = data.split_at(split);
    let mut bytes = [0_u8; 8];
    bytes[..split].copy_from_slice(head);
    (u64::from_le_bytes(bytes), rest)
}
