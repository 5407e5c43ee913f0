//! [`Collected`]: the bytes read so far from a body, copied only when there is more than one chunk.

use bytes::{Bytes, BytesMut};

/// Data frames gathered from a body. A body that arrives in one frame (`Full<Bytes>`, a small
/// JSON error) is kept as that frame's `Bytes`: no copy. A second frame switches to one
/// contiguous buffer, because replay hands out one `Bytes` and classifiers read one slice.
#[derive(Debug, Default)]
pub(crate) enum Collected {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Collected {
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Self::Empty => Self::One(chunk),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len().saturating_add(chunk.len()));
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&chunk);
                Self::Many(joined)
            }
            Self::Many(mut joined) => {
                joined.extend_from_slice(&chunk);
                Self::Many(joined)
            }
        };
    }

    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Self::Empty => &[],
            Self::One(bytes) => bytes,
            Self::Many(joined) => joined,
        }
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Self::Empty => Bytes::new(),
            Self::One(bytes) => bytes,
            Self::Many(joined) => joined.freeze(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_chunk_is_kept_without_a_copy() {
        let chunk = Bytes::from_static(b"{\"model\":\"m\"}");
        let mut collected = Collected::default();
        collected.push(chunk.clone());
        collected.push(Bytes::new());
        assert_eq!(collected.len(), 13);
        let bytes = collected.into_bytes();
        // Same backing storage: a static slice stays the same pointer.
        assert_eq!(bytes.as_ptr(), chunk.as_ptr());
    }

    #[test]
    fn chunks_are_joined_in_order() {
        let mut collected = Collected::default();
        for chunk in ["ab", "cd", "ef"] {
            collected.push(Bytes::from_static(chunk.as_bytes()));
        }
        assert_eq!(collected.len(), 6);
        assert_eq!(collected.as_slice(), b"abcdef");
        assert_eq!(collected.into_bytes(), Bytes::from_static(b"abcdef"));
    }
}
