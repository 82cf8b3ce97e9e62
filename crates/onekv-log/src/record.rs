//! Record framing: the bytes of one record and the decoder that checks them.
//!
//! Layout of a record (all integers little-endian; full description and crash analysis in
//! `docs/design/log-format.md`):
//!
//! ```text
//! offset  size  field
//!      0     4  magic         b"OKRC"
//!      4     4  payload_len   u32
//!      8     4  batch_offset  u32, bytes from the first record of the same write to this record
//!     12     1  kind          u8, never 0 (chosen by the caller; the log does not interpret it)
//!     13     1  flags         u8, must be 0
//!     14     2  salt          u16, the salt of the segment holding the record (0 in format 1)
//!     16     4  crc           u32, CRC-32C over position (u64) ‖ bytes 0..16 ‖ payload
//!     20     n  payload
//! ```
//!
//! The checksum is seeded with the record's own log position, so a record copied or read from the
//! wrong place never verifies. The position is not stored: the reader always knows where it read.
//! The salt ties a record to one use of its file: a recycled segment file still holds records of its
//! earlier use after the new ones, and those fail the salt check (see `segment`).
//!
//! `batch_offset` lets recovery tell a torn last write from corruption: every record written by one
//! group commit (one write call, one fsync) points back at the first record of that write, so a
//! valid record whose write began *after* a bad record proves the bad record had been synced.
//!
//! This module is pure (no I/O) so that it can be property-tested and fuzzed on arbitrary bytes.

use std::num::NonZeroU8;

/// First four bytes of every record.
pub const RECORD_MAGIC: [u8; 4] = *b"OKRC";
/// Bytes of framing before each payload.
pub const RECORD_HEADER_LEN: usize = 20;

/// What a record holds, as the caller defines it. The log stores and returns it but never
/// interprets it; zero is reserved so that zero-filled space never looks like a record.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RecordKind(NonZeroU8);

impl RecordKind {
    /// The kind numbered `n`, or `None` for the reserved zero.
    pub const fn new(n: u8) -> Option<Self> {
        match NonZeroU8::new(n) {
            Some(n) => Some(RecordKind(n)),
            None => None,
        }
    }

    /// The kind's number as stored on disk.
    pub const fn get(self) -> u8 {
        self.0.get()
    }
}

/// Why bytes are not a valid record.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum Invalid {
    /// The first four bytes are not [`RECORD_MAGIC`].
    #[error("bad magic")]
    BadMagic,
    /// Kind zero, non-zero flags, or a batch offset reaching before position 0.
    #[error("bad header field")]
    BadHeader,
    /// A record of another segment, or of an earlier use of this segment's file: its salt is not
    /// the segment's.
    #[error("record carries another segment's salt")]
    WrongSalt,
    /// The length field exceeds the largest payload this log accepts.
    #[error("payload length {len} exceeds the limit {max}")]
    TooLong {
        /// Length read from the header.
        len: u32,
        /// Largest payload the log accepts.
        max: u32,
    },
    /// The CRC-32C does not match the header and payload read at this position.
    #[error("checksum mismatch")]
    ChecksumMismatch,
}

/// The result of decoding bytes that should start with a record.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole record whose checksum verified.
    Record {
        /// The caller's record kind.
        kind: RecordKind,
        /// Distance back to the first record of the write this record was part of.
        batch_offset: u32,
        /// The payload bytes, borrowed from the input.
        payload: &'a [u8],
        /// Header plus payload: where the next record starts.
        total_len: usize,
    },
    /// The input ends before the record does, and what is there is consistent with a record.
    Incomplete,
    /// The input cannot be the start of a record.
    Invalid(Invalid),
}

/// Total bytes a record with `payload_len` bytes of payload occupies.
pub const fn framed_len(payload_len: usize) -> usize {
    RECORD_HEADER_LEN + payload_len
}

fn checksum(position: u64, header_prefix: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&position.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, header_prefix);
    crc32c::crc32c_append(crc, payload)
}

/// Where a record is, as its checksum and salt bind it: its log position and its segment's salt.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Place {
    /// Where the record's first header byte is in the log.
    pub position: u64,
    /// The salt of the segment holding it.
    pub salt: u16,
}

/// Appends the framed record to `out`, to be written at `at`; `batch_offset` is how far after the
/// first record of the same write it starts.
///
/// # Panics
/// If the payload is longer than `u32::MAX`; the log checks its own, smaller limit before calling.
pub fn encode(out: &mut Vec<u8>, at: Place, batch_offset: u32, kind: RecordKind, payload: &[u8]) {
    let Place { position, salt } = at;
    let len = u32::try_from(payload.len()).expect("payload length checked by the caller");
    let mut header = [0u8; RECORD_HEADER_LEN];
    header[0..4].copy_from_slice(&RECORD_MAGIC);
    header[4..8].copy_from_slice(&len.to_le_bytes());
    header[8..12].copy_from_slice(&batch_offset.to_le_bytes());
    header[12] = kind.get();
    // header[13] (flags) stays zero.
    header[14..16].copy_from_slice(&salt.to_le_bytes());
    let crc = checksum(position, &header[..16], payload);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

/// Decodes the record that should start at the beginning of `buf`, which was read from `at`.
///
/// Never reads past `buf` and never panics, whatever the bytes. A payload longer than
/// `max_payload` is [`Invalid::TooLong`], so a corrupt length can never make a caller allocate or
/// read more than its own limit.
pub fn decode(at: Place, buf: &[u8], max_payload: u32) -> Decoded<'_> {
    let Place { position, salt } = at;
    let magic_have = buf.len().min(RECORD_MAGIC.len());
    if buf[..magic_have] != RECORD_MAGIC[..magic_have] {
        return Decoded::Invalid(Invalid::BadMagic);
    }
    let Some(header) = buf.get(..RECORD_HEADER_LEN) else {
        return Decoded::Incomplete;
    };
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let batch_offset = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    let Some(kind) = RecordKind::new(header[12]) else {
        return Decoded::Invalid(Invalid::BadHeader);
    };
    if header[13] != 0 || u64::from(batch_offset) > position {
        return Decoded::Invalid(Invalid::BadHeader);
    }
    if u16::from_le_bytes([header[14], header[15]]) != salt {
        return Decoded::Invalid(Invalid::WrongSalt);
    }
    if len > max_payload {
        return Decoded::Invalid(Invalid::TooLong { len, max: max_payload });
    }
    let total_len = framed_len(len as usize);
    let Some(payload) = buf.get(RECORD_HEADER_LEN..total_len) else {
        return Decoded::Incomplete;
    };
    let stored = u32::from_le_bytes([header[16], header[17], header[18], header[19]]);
    if checksum(position, &header[..16], payload) != stored {
        return Decoded::Invalid(Invalid::ChecksumMismatch);
    }
    Decoded::Record { kind, batch_offset, payload, total_len }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KIND: RecordKind = RecordKind::new(7).unwrap();
    const SALT: u16 = 0x5a17;

    fn at(position: u64) -> Place {
        Place { position, salt: SALT }
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&mut buf, at(4096), 40, KIND, b"hello");
        assert_eq!(buf.len(), framed_len(5));
        assert_eq!(
            decode(at(4096), &buf, 100),
            Decoded::Record { kind: KIND, batch_offset: 40, payload: b"hello", total_len: 25 }
        );
    }

    #[test]
    fn checksum_binds_the_position() {
        let mut buf = Vec::new();
        encode(&mut buf, at(4096), 0, KIND, b"hello");
        assert_eq!(decode(at(4097), &buf, 100), Decoded::Invalid(Invalid::ChecksumMismatch));
    }

    #[test]
    fn a_record_of_another_salt_never_decodes() {
        let mut buf = Vec::new();
        encode(&mut buf, at(4096), 0, KIND, b"hello");
        let other = Place { position: 4096, salt: SALT ^ 1 };
        assert_eq!(decode(other, &buf, 100), Decoded::Invalid(Invalid::WrongSalt));
    }

    #[test]
    fn prefixes_are_incomplete_and_zeros_invalid() {
        let mut buf = Vec::new();
        encode(&mut buf, at(0), 0, KIND, b"payload");
        for cut in 0..buf.len() {
            assert_eq!(decode(at(0), &buf[..cut], 100), Decoded::Incomplete, "cut at {cut}");
        }
        assert_eq!(decode(at(0), &[0u8; 64], 100), Decoded::Invalid(Invalid::BadMagic));
    }

    #[test]
    fn length_limit_is_enforced_before_reading_the_payload() {
        let mut buf = Vec::new();
        encode(&mut buf, at(0), 0, KIND, &[1u8; 50]);
        assert_eq!(decode(at(0), &buf, 49), Decoded::Invalid(Invalid::TooLong { len: 50, max: 49 }));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_or_over_read(
            position in any::<u64>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
            max in 0u32..512,
        ) {
            match decode(at(position), &bytes, max) {
                Decoded::Record { payload, total_len, .. } => {
                    prop_assert!(total_len <= bytes.len());
                    prop_assert_eq!(payload.len() + RECORD_HEADER_LEN, total_len);
                    prop_assert!(payload.len() as u64 <= u64::from(max));
                }
                Decoded::Incomplete | Decoded::Invalid(_) => {}
            }
        }

        #[test]
        fn any_single_byte_flip_is_detected(
            position in any::<u64>(),
            payload in proptest::collection::vec(any::<u8>(), 0..128),
            flip_at in any::<prop::sample::Index>(),
            flip_mask in 1u8..=255,
        ) {
            let mut buf = Vec::new();
            encode(&mut buf, at(position), 0, KIND, &payload);
            let i = flip_at.index(buf.len());
            buf[i] ^= flip_mask;
            let decoded = decode(at(position), &buf, 1024);
            prop_assert!(
                !matches!(decoded, Decoded::Record { .. }),
                "flip at {} still decoded", i
            );
        }

        #[test]
        fn encode_decode_round_trips(
            position in any::<u64>(),
            kind in 1u8..=255,
            batch_offset in any::<u32>(),
            payload in proptest::collection::vec(any::<u8>(), 0..1024),
            trailing in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let kind = RecordKind::new(kind).unwrap();
            let batch_offset = (u64::from(batch_offset) % (position.saturating_add(1))) as u32;
            let mut buf = Vec::new();
            encode(&mut buf, at(position), batch_offset, kind, &payload);
            let total = buf.len();
            buf.extend_from_slice(&trailing);
            prop_assert_eq!(
                decode(at(position), &buf, 1024),
                Decoded::Record { kind, batch_offset, payload: &payload, total_len: total }
            );
        }
    }
}
