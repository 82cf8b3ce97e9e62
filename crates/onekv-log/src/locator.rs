//! Locators: where bytes live in the log.
//!
//! A locator is a position in the log's address space plus a length. The log hands one out for each
//! record it appends (naming the record's payload), and callers may narrow it to any sub-range of that
//! payload (the index points at a value inside a Raft entry this way). Positions are never reused or
//! renumbered, so a locator stays valid until the segment holding it is reclaimed.
//!
//! This module owns the 16-byte on-disk encoding of a locator; it does not know what the bytes mean.

use std::fmt;

/// A position and a length in the log: exactly the bytes a targeted read returns.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Locator {
    /// Byte position of the first byte, in the log's address space (segment base + file offset).
    pub position: u64,
    /// Number of bytes.
    pub len: u64,
}

impl Locator {
    /// Size of [`Locator::to_bytes`]: two little-endian `u64`s.
    pub const ENCODED_LEN: usize = 16;

    /// A locator for `len` bytes at `position`.
    pub const fn new(position: u64, len: u64) -> Self {
        Self { position, len }
    }

    /// One past the last byte named.
    pub const fn end(&self) -> u64 {
        self.position + self.len
    }

    /// The sub-range `[offset, offset + len)` of these bytes, or `None` if it does not fit inside.
    ///
    /// This is how a value inside a record's payload gets its own locator: the command codec reports
    /// the value's offset within the payload, and the caller narrows the record's locator to it.
    pub fn slice(&self, offset: u64, len: u64) -> Option<Locator> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| Locator::new(self.position + offset, len))
    }

    /// The 16-byte on-disk form: position then length, each `u64` little-endian.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[..8].copy_from_slice(&self.position.to_le_bytes());
        out[8..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes [`Locator::to_bytes`]; `None` if `bytes` is not exactly 16 bytes long or names a range
    /// that overflows the address space.
    pub fn from_bytes(bytes: &[u8]) -> Option<Locator> {
        let bytes: &[u8; Self::ENCODED_LEN] = bytes.try_into().ok()?;
        let position = u64::from_le_bytes(bytes[..8].try_into().ok()?);
        let len = u64::from_le_bytes(bytes[8..].try_into().ok()?);
        position.checked_add(len)?;
        Some(Locator { position, len })
    }
}

impl fmt::Display for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.position, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_is_little_endian() {
        let loc = Locator::new(0x0102_0304_0506_0708, 0x10);
        let bytes = loc.to_bytes();
        assert_eq!(bytes[0], 0x08);
        assert_eq!(bytes[8], 0x10);
        assert_eq!(Locator::from_bytes(&bytes), Some(loc));
        assert_eq!(Locator::from_bytes(&bytes[..15]), None);
        assert_eq!(Locator::from_bytes(&[0xff; 16]), None, "overflowing range rejected");
    }

    #[test]
    fn slice_stays_inside() {
        let loc = Locator::new(100, 10);
        assert_eq!(loc.slice(2, 8), Some(Locator::new(102, 8)));
        assert_eq!(loc.slice(0, 0), Some(Locator::new(100, 0)));
        assert_eq!(loc.slice(3, 8), None);
        assert_eq!(loc.slice(u64::MAX, 2), None);
    }
}
