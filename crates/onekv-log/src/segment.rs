//! Segment files: their names and the header each one starts with.
//!
//! A segment is one file holding a contiguous stretch of the log's address space. Its name is its base
//! position as 20 decimal digits (so names sort like positions) with the extension `.seg`; byte `o` of
//! the file is log position `base + o`. The file starts with a 32-byte header, then whole records.
//! Records never span segments.
//!
//! ```text
//! offset  size  field
//!      0     4  magic        b"OKSG"
//!      4     2  version      u16, currently 1
//!      6     2  header_len   u16, 32
//!      8     8  base         u64, the segment's first position (equals the file name)
//!     16    12  reserved     zero
//!     28     4  crc          u32, CRC-32C over bytes 0..28
//! ```
//!
//! This module is pure: it encodes and checks headers and names, and does no I/O.

/// First four bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"OKSG";
/// Bytes before the first record of a segment.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// The only format version this code reads and writes.
pub const FORMAT_VERSION: u16 = 1;
const EXTENSION: &str = ".seg";

/// The file name of the segment whose first position is `base`.
pub fn file_name(base: u64) -> String {
    format!("{base:020}{EXTENSION}")
}

/// The base position named by a segment file name, or `None` for any other file.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(EXTENSION)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header of the segment starting at `base`.
pub fn encode_header(base: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&(SEGMENT_HEADER_LEN as u16).to_le_bytes());
    h[8..16].copy_from_slice(&base.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment header was rejected.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header: the file was cut short while being created.
    #[error("segment header is incomplete")]
    Incomplete,
    /// Magic or checksum wrong.
    #[error("segment header is damaged")]
    Damaged,
    /// A well-formed header from a format this code does not know.
    #[error("segment format version {0} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion(u16),
    /// The header names a different base than the file name.
    #[error("segment header says base {found}, file name says {expected}")]
    BaseMismatch {
        /// Base from the file name.
        expected: u64,
        /// Base from the header.
        found: u64,
    },
}

/// Checks that `bytes` start with the header of the segment at `expected_base`.
pub fn check_header(bytes: &[u8], expected_base: u64) -> Result<(), HeaderError> {
    let Some(h) = bytes.get(..SEGMENT_HEADER_LEN) else {
        return Err(HeaderError::Incomplete);
    };
    let stored = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
    if h[0..4] != SEGMENT_MAGIC || crc32c::crc32c(&h[..28]) != stored {
        return Err(HeaderError::Damaged);
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    let header_len = u16::from_le_bytes([h[6], h[7]]);
    if version != FORMAT_VERSION || usize::from(header_len) != SEGMENT_HEADER_LEN {
        return Err(HeaderError::UnsupportedVersion(version));
    }
    let found = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    if found != expected_base {
        return Err(HeaderError::BaseMismatch { expected: expected_base, found });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_like_positions() {
        assert_eq!(file_name(42), "00000000000000000042.seg");
        assert_eq!(parse_file_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert!(file_name(9) < file_name(10));
        assert_eq!(parse_file_name("42.seg"), None);
        assert_eq!(parse_file_name("0000000000000000004x.seg"), None);
        assert_eq!(parse_file_name("00000000000000000042.tmp"), None);
    }

    #[test]
    fn header_round_trip_and_every_flip_detected() {
        let h = encode_header(1 << 40);
        assert_eq!(check_header(&h, 1 << 40), Ok(()));
        assert_eq!(check_header(&h, 7), Err(HeaderError::BaseMismatch { expected: 7, found: 1 << 40 }));
        assert_eq!(check_header(&h[..31], 1 << 40), Err(HeaderError::Incomplete));
        for i in 0..SEGMENT_HEADER_LEN {
            let mut bad = h;
            bad[i] ^= 0x20;
            assert_eq!(check_header(&bad, 1 << 40), Err(HeaderError::Damaged), "byte {i}");
        }
    }
}
