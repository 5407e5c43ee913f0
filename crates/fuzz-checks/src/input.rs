//! Turns a fuzzer's bytes into the inputs stormguard's parsers see: header maps, bodies (whole,
//! or arriving in chunks), and streams cut into parts by length prefixes.
//!
//! Layout of one input: a count byte (headers = count % 16), then per header a name byte (an
//! index into the target's list of header names), a length byte and that many value bytes; what
//! is left is the body. Values the `http` crate refuses (control characters) are skipped, as a
//! server would never hand them over.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame};

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

/// Splits `data` at a length read from its first two bytes (little-endian, capped at what is
/// there): the part of that length, and the rest.
pub fn length_prefixed(data: &[u8]) -> (&[u8], &[u8]) {
    let (length, rest) = match data {
        [low, high, rest @ ..] => (usize::from(u16::from_le_bytes([*low, *high])), rest),
        _ => (0, &[][..]),
    };
    rest.split_at(length.min(rest.len()))
}

/// A body that arrives in the given chunks, one data frame each, every frame ready at once.
pub struct Chunked {
    chunks: VecDeque<Bytes>,
}

impl Chunked {
    /// `bytes` in chunks of `size` bytes (at least 1), the last one shorter.
    pub fn new(bytes: &[u8], size: usize) -> Self {
        Self {
            chunks: bytes
                .chunks(size.max(1))
                .map(Bytes::copy_from_slice)
                .collect(),
        }
    }
}

impl Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.chunks.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }
}

/// The output of a future that must be ready at once (it waits on nothing but ready bodies).
pub fn now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("a future over ready bodies is pending"),
    }
}

/// Every data byte of a body whose frames are all ready, in order; `None` at a read error.
pub fn read_body<B: Body<Data = Bytes>>(body: B) -> Option<Vec<u8>> {
    let mut body = std::pin::pin!(body);
    let mut read = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(None) => return Some(read),
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Poll::Ready(Some(Err(_))) => return None,
            Poll::Pending => panic!("a body of ready frames is pending"),
        }
    }
}
